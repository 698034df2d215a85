"""The training step: the reference backward (to run before a backend's own step), the optimizer and
scheduler wrappers, and the forward patch for mixed precision."""

from __future__ import annotations

from drivetrain.training.backward import reference_backward
from drivetrain.training.modeling import patch_forward_with_autocast
from drivetrain.training.optimizer import AcceleratedOptimizer
from drivetrain.training.scheduler import AcceleratedScheduler, rebind_scheduler, track_step_for_schedulers

__all__ = [
    "reference_backward",
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "track_step_for_schedulers",
    "rebind_scheduler",
    "patch_forward_with_autocast",
]
