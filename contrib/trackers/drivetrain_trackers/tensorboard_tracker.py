"""TensorBoard through ``torch.utils.tensorboard`` (needs the ``tensorboard`` package)."""

from __future__ import annotations

import os
from typing import Any

from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process
from drivetrain_trackers._values import is_number, warn_skipped


class TensorBoardTracker(GeneralTracker):
    """Writes event files to ``<logging_dir>/<run_name>``.

    :param run_name: sub-folder of ``logging_dir`` for this run.
    :param logging_dir: the Accelerator's ``logging_dir``.
    :param kwargs: passed to ``torch.utils.tensorboard.SummaryWriter`` (``flush_secs``, ``max_queue``...).
    """

    name = "tensorboard"
    requires_logging_directory = True
    requires = ("torch.utils.tensorboard",)

    @on_main_process
    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__()
        from torch.utils.tensorboard import SummaryWriter

        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer = SummaryWriter(self.logging_dir, **kwargs)

    @property
    def tracker(self) -> Any:
        return getattr(self, "writer", None)

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Hyperparameters go to TensorBoard's HParams tab (in this run's folder) and to ``hparams.yml``."""
        import yaml

        hparams = {
            key: value if isinstance(value, (bool, int, float, str)) else str(value)
            for key, value in values.items()
        }
        self.writer.add_hparams(hparams, metric_dict={}, run_name=".")
        self.writer.flush()
        try:
            text = yaml.safe_dump(dict(values))
        except yaml.YAMLError:  # objects YAML cannot represent: keep their str()
            text = yaml.safe_dump(hparams)
        with open(os.path.join(self.logging_dir, "hparams.yml"), "w", encoding="utf-8") as handle:
            handle.write(text)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers become scalars, strings text, and dicts of numbers grouped scalars."""
        skipped = []
        for key, value in values.items():
            if is_number(value):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict) and all(is_number(v) for v in value.values()):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
            else:
                skipped.append(key)
        warn_skipped(self.name, skipped)
        self.writer.flush()

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """``values`` maps a tag to a batch of images (N, C, H, W by default; ``dataformats="NHWC"``)."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def finish(self) -> None:
        self.writer.close()
