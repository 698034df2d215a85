"""Trackio (local-first: runs go to a SQLite file per project under ``TRACKIO_DIR``)."""

from __future__ import annotations

from typing import Any

from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process


class TrackioTracker(GeneralTracker):
    """One trackio run in the project ``run_name``.

    :param run_name: the trackio project.
    :param kwargs: passed to ``trackio.init`` (``name=`` for the run, ``space_id=``, ``config=``...).

    As in Accelerate, the run is created by :meth:`start` (``init_trackers`` calls it), and every process logs
    (``main_process_only = False``): pass a ``name`` per process, or log from the main process only.
    """

    name = "trackio"
    requires_logging_directory = False
    main_process_only = False
    requires = ("trackio",)

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @on_main_process
    def start(self) -> None:
        import trackio

        self.run = trackio.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        import trackio

        trackio.config.update(values, allow_val_change=True)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
