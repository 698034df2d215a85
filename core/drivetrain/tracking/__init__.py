"""Experiment tracking (Accelerate's ``accelerate.tracking``): the ``GeneralTracker`` base class, how
``log_with`` is resolved, and the Accelerator's tracking methods. Tracker classes come from plugins
(``drivetrain-trackers``); see docs/tracking.md."""

from drivetrain.tracking.trackers import (
    GeneralTracker,
    TrackingMixin,
    on_main_process,
    registered_trackers,
    resolve_log_with,
    validate_log_with,
)

__all__ = [
    "GeneralTracker",
    "TrackingMixin",
    "on_main_process",
    "registered_trackers",
    "resolve_log_with",
    "validate_log_with",
]
