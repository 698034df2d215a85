"""DVCLive: metrics, parameters and plots as plain files (``dvclive/`` by default) that DVC reads."""

from __future__ import annotations

from typing import Any

from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process
from drivetrain_trackers._values import is_number, warn_skipped


class DVCLiveTracker(GeneralTracker):
    """One ``dvclive.Live`` logger.

    :param run_name: unused by DVCLive (kept for the common tracker signature).
    :param live: an existing ``dvclive.Live`` to use instead of building one.
    :param kwargs: passed to ``dvclive.Live`` (``dir``, ``save_dvc_exp``, ``report``...).
    """

    name = "dvclive"
    requires_logging_directory = False
    requires = ("dvclive",)

    @on_main_process
    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__()
        from dvclive import Live

        self.run_name = run_name
        self.live = live if live is not None else Live(**kwargs)

    @property
    def tracker(self) -> Any:
        return getattr(self, "live", None)

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.live.log_params(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """What DVCLive can log as a metric (numbers, and strings, which its .tsv files hold as written) at
        ``step``, then DVCLive moves to the next step; other values are skipped with a warning."""
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        skipped = []
        for key, value in values.items():
            if is_number(value) or Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            else:
                skipped.append(key)
        warn_skipped(self.name, skipped)
        self.live.next_step()

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """``values`` maps a file name ending in .png/.jpg to an image (PIL, numpy array, path)."""
        if step is not None:
            self.live.step = step
        for key, image in values.items():
            self.live.log_image(key, image, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.live.end()
