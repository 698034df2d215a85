"""Aim: runs stored in a local Aim repository (``aim up`` shows them)."""

from __future__ import annotations

import os
from typing import Any

from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process


class AimTracker(GeneralTracker):
    """One Aim run in the repository at ``logging_dir`` (created when missing).

    :param run_name: the run's name.
    :param logging_dir: the Aim repository folder.
    :param kwargs: passed to ``aim.Run`` (``experiment``, ``system_tracking_interval``...).
    """

    name = "aim"
    requires_logging_directory = True
    requires = ("aim",)

    def __init__(self, run_name: str, logging_dir: str | os.PathLike = ".", **kwargs: Any) -> None:
        # the run is made by start() (init_trackers calls it): building the tracker before the Accelerator
        # touches no process state, as in Accelerate; `repo=` in kwargs names the repository too
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = {"repo": os.fspath(logging_dir), **kwargs}
        self.writer: Any = None

    @on_main_process
    def start(self) -> None:
        from aim import Run

        self.writer = Run(**self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.writer["hparams"] = values

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Each value is tracked as its own sequence; ``kwargs`` go to ``Run.track`` (``context``...)."""
        for key, value in values.items():
            self.writer.track(value, name=key, step=step, **kwargs)

    @on_main_process
    def log_images(
        self, values: dict, step: int | None = None, kwargs: dict[str, dict] | None = None
    ) -> None:
        """``values`` maps a name to an image or ``(image, caption)``; ``kwargs`` may hold
        ``{"aim_image": {...}, "track": {...}}`` for ``aim.Image`` and ``Run.track``."""
        from aim import Image

        kwargs = kwargs or {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(
                Image(image, caption=caption, **kwargs.get("aim_image", {})),
                name=key,
                step=step,
                **kwargs.get("track", {}),
            )

    @on_main_process
    def finish(self) -> None:
        self.writer.close()
