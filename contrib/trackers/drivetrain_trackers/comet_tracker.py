"""Comet ML. Offline runs (``init_kwargs={"comet_ml": {"online": False}}`` with an ``experiment_config``
naming ``offline_directory``) write an archive to upload later with ``comet upload``."""

from __future__ import annotations

from typing import Any

from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process
from drivetrain_trackers._values import is_number, warn_skipped


class CometMLTracker(GeneralTracker):
    """One Comet experiment.

    :param run_name: the Comet project name.
    :param kwargs: passed to ``comet_ml.start`` (``workspace``, ``api_key``, ``online``, ``mode``,
        ``experiment_config``...).
    """

    name = "comet_ml"
    requires_logging_directory = False
    requires = ("comet_ml",)

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        # the experiment is started by start() (init_trackers calls it): building the tracker before the
        # Accelerator touches no process state and no Comet server, as in Accelerate
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer: Any = None

    @on_main_process
    def start(self) -> None:
        import comet_ml

        self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.writer.log_parameters(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers become metrics, strings "other" values, dicts of numbers several metrics."""
        if step is not None:
            self.writer.set_step(step)
        skipped = []
        for key, value in values.items():
            if is_number(value):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)
            else:
                skipped.append(key)
        warn_skipped(self.name, skipped)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """``values`` maps a name to one image or a list of them (arrays, PIL images, paths)."""
        for key, images in values.items():
            for image in images if isinstance(images, list) else [images]:
                self.writer.log_image(image, name=key, step=step, **kwargs)

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """A table from ``columns`` and ``data`` rows, or a pandas ``dataframe``, saved as ``table_name``."""
        if step is not None:
            self.writer.set_step(step)
        if dataframe is not None:
            self.writer.log_table(table_name, tabular_data=dataframe, **kwargs)
        else:
            self.writer.log_table(table_name, tabular_data=data, headers=columns or False, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.writer.end()
