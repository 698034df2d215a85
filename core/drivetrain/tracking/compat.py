"""Accelerate's module-level tracking API (``accelerate.tracking``): ``LOGGER_TYPE_TO_CLASS``,
``get_available_trackers`` and ``filter_trackers``, answered from the trackers plugins register and those
registered with ``register_tracker_class``."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator, MutableMapping
from typing import Any

from drivetrain.tracking.trackers import (
    _USER_TRACKERS,
    GeneralTracker,
    register_tracker_class,
    registered_trackers,
)

logger = logging.getLogger(__name__)

#: Accelerate's built-in tracker names -> class names (``LOGGER_TYPE_TO_CLASS`` always lists these).
ACCELERATE_TRACKERS = {
    "aim": "AimTracker",
    "comet_ml": "CometMLTracker",
    "mlflow": "MLflowTracker",
    "tensorboard": "TensorBoardTracker",
    "wandb": "WandBTracker",
    "clearml": "ClearMLTracker",
    "dvclive": "DVCLiveTracker",
    "swanlab": "SwanLabTracker",
    "trackio": "TrackioTracker",
}


class _TrackerClasses(MutableMapping):
    """Tracker name -> class, live: the registered trackers, and Accelerate's built-in names (a placeholder
    naming the plugin to install when none provides it). Setting an item registers a tracker class."""

    def _current(self) -> dict[str, type]:
        classes = {name: cls for name, (_plugin, cls) in registered_trackers().items()}
        for name, class_name in ACCELERATE_TRACKERS.items():
            if name not in classes:
                classes[name] = getattr(importlib.import_module("drivetrain.tracking"), class_name)
        return classes

    def __getitem__(self, name: str) -> type:
        return self._current()[str(name)]

    def __setitem__(self, name: str, tracker_class: type) -> None:
        _USER_TRACKERS[str(name)] = tracker_class

    def __delitem__(self, name: str) -> None:
        del _USER_TRACKERS[str(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def __repr__(self) -> str:
        return repr(self._current())


LOGGER_TYPE_TO_CLASS = _TrackerClasses()


def get_available_trackers() -> list[Any]:
    """The trackers whose library imports here (``LoggerType`` members where Accelerate has one, else names)."""
    from drivetrain.config.enums import LoggerType

    available = []
    for name, (_plugin, cls) in sorted(registered_trackers().items()):
        if cls.unavailable_reason() is None:
            available.append(LoggerType(name) if name in LoggerType else name)
    return available


def filter_trackers(log_with: Any, logging_dir: str | os.PathLike | None = None) -> list[Any]:
    """Accelerate's ``filter_trackers``: the entries of ``log_with`` that can run here, without repeats
    (``"all"`` expands to every available tracker, tracker instances kept). Raises ValueError for an unknown
    name, or for a tracker that needs a logging directory when ``logging_dir`` is None; a known tracker whose
    library is missing is left out (logged at debug level)."""
    from drivetrain.config.enums import LoggerType

    if log_with is None:
        return []
    entries = list(log_with) if isinstance(log_with, list | tuple) else [log_with]
    available = get_available_trackers()
    if "all" in entries or LoggerType.ALL in entries:
        return [entry for entry in entries if isinstance(entry, GeneralTracker)] + available
    registered = registered_trackers()
    chosen: list[Any] = []
    for entry in entries:
        if isinstance(entry, GeneralTracker):
            chosen.append(entry)
            continue
        name = str(entry)
        if name not in LoggerType and name not in registered:
            raise ValueError(f"Unsupported logging capability: {entry}. Choose between {LoggerType.list()}")
        key = LoggerType(name) if name in LoggerType else name
        if key in chosen:
            continue
        if key not in available:
            logger.debug(f"Tried adding logger {key}, but package is unavailable in the system.")
            continue
        if registered[name][1].requires_logging_directory and logging_dir is None:
            raise ValueError(f"Logging with `{name}` requires a `logging_dir` to be passed in.")
        chosen.append(key)
    return chosen


__all__ = ["LOGGER_TYPE_TO_CLASS", "filter_trackers", "get_available_trackers", "register_tracker_class"]
