"""ClearML. ``Task.set_offline(True)`` before ``init_trackers`` records the task on disk (an archive for
``clearml-task import-offline``)."""

from __future__ import annotations

import os
from typing import Any

from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process
from drivetrain_trackers._values import is_number, warn_skipped

_SERIES_PREFIXES = ("train", "eval", "test")


def title_and_series(key: str) -> tuple[str, str]:
    """ClearML plots one title with several series: ``eval_loss`` -> (``loss``, ``eval``); keys without one
    of the prefixes train/eval/test go to the ``train`` series."""
    for prefix in _SERIES_PREFIXES:
        if key.startswith(prefix + "_"):
            return key[len(prefix) + 1 :], prefix
    return key, "train"


class ClearMLTracker(GeneralTracker):
    """The current ClearML task, or a new one.

    :param run_name: project and task name unless ``project_name``/``task_name`` (or ``CLEARML_PROJECT`` /
        ``CLEARML_TASK``) say otherwise.
    :param kwargs: passed to ``clearml.Task.init``.
    """

    name = "clearml"
    requires_logging_directory = False
    requires = ("clearml",)

    @on_main_process
    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        from clearml import Task

        current: Any = Task.current_task()
        # A task the user started is theirs to close.
        self._owns_task = current is None
        if current is not None:
            self.task = current
            return
        kwargs.setdefault("project_name", os.environ.get("CLEARML_PROJECT", run_name))
        kwargs.setdefault("task_name", os.environ.get("CLEARML_TASK", run_name))
        self.task = Task.init(**kwargs)

    @property
    def tracker(self) -> Any:
        return getattr(self, "task", None)

    @on_main_process
    def store_init_configuration(self, values: dict) -> Any:
        return self.task.connect_configuration(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers become scalars (``eval_loss`` plots as title ``loss``, series ``eval``); without ``step``,
        single values."""
        clearml_logger = self.task.get_logger()
        skipped = []
        for key, value in values.items():
            if not is_number(value):
                skipped.append(key)
            elif step is None:
                clearml_logger.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = title_and_series(key)
                clearml_logger.report_scalar(
                    title=title, series=series, value=value, iteration=step, **kwargs
                )
        warn_skipped(self.name, skipped)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """``values`` maps a name to an image (numpy array or PIL image)."""
        clearml_logger = self.task.get_logger()
        for key, image in values.items():
            title, series = title_and_series(key)
            clearml_logger.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

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
        """A table from ``columns`` and ``data`` rows, or a pandas ``dataframe``."""
        if dataframe is None and data is None:
            raise ValueError("ClearMLTracker.log_table needs `data` (rows) or `dataframe`")
        table = dataframe if dataframe is not None else ([columns, *(data or [])] if columns else data)
        title, series = title_and_series(table_name)
        self.task.get_logger().report_table(
            title=title, series=series, table_plot=table, iteration=step, **kwargs
        )

    @on_main_process
    def finish(self) -> None:
        if self._owns_task:
            self.task.close()
