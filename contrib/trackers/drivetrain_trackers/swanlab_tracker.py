"""SwanLab (``mode="offline"`` keeps the run in a local ``.swanlab`` file under ``logdir``; ``swanlab sync``
uploads it later)."""

from __future__ import annotations

from typing import Any

from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process


class SwanLabTracker(GeneralTracker):
    """One SwanLab experiment in the project ``run_name``.

    :param run_name: the SwanLab project.
    :param kwargs: passed to ``swanlab.init`` (``experiment_name=``, ``mode=``, ``logdir=``...).

    As in Accelerate, the run is created by :meth:`start` (``init_trackers`` calls it), and every process logs
    (``main_process_only = False``).
    """

    name = "swanlab"
    requires_logging_directory = False
    main_process_only = False
    requires = ("swanlab",)

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @on_main_process
    def start(self) -> None:
        import swanlab

        self.run = swanlab.init(project=self.run_name, **self.init_kwargs)
        swanlab.config["FRAMEWORK"] = "drivetrain"

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        import swanlab

        swanlab.config.update(values, allow_val_change=True)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers (and SwanLab's own data types); ``print_to_console=`` and other ``swanlab.log`` options pass."""
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """``values`` maps a key to a list of images (numpy arrays or PIL images)."""
        import swanlab

        for key, images in values.items():
            self.log({key: [swanlab.Image(image) for image in images]}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
