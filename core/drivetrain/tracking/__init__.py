"""Experiment tracking (Accelerate's ``accelerate.tracking``): the ``GeneralTracker`` base class, how
``log_with`` is resolved, and the Accelerator's tracking methods. Tracker classes come from plugins
(``drivetrain-trackers``): without it they are importable, and using one says what to install. See
docs/tracking.md."""

from drivetrain.contract.reexport import LOGGER, reexport
from drivetrain.tracking.trackers import (
    GeneralTracker,
    TrackingMixin,
    on_main_process,
    register_tracker_class,
    registered_trackers,
    resolve_log_with,
    validate_log_with,
)

_reexport_getattr, __dir__, _names = reexport(
    __name__,
    {
        "LOGGER_TYPE_TO_CLASS": "drivetrain.tracking.compat",
        "filter_trackers": "drivetrain.tracking.compat",
        "get_available_trackers": "drivetrain.tracking.compat",
        "logger": LOGGER,
    },
)
__getattr__ = _reexport_getattr

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "GeneralTracker",
    "TrackingMixin",
    "filter_trackers",
    "get_available_trackers",
    "logger",
    "on_main_process",
    "register_tracker_class",
    "registered_trackers",
    "resolve_log_with",
    "validate_log_with",
    *(name for name in _names if name.endswith("Tracker")),  # plugins' tracker classes
]
