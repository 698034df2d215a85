"""Accelerate's ``accelerate.scheduler`` path: :class:`AcceleratedScheduler` lives in
:mod:`drivetrain.training.scheduler`."""

from drivetrain.training.scheduler import AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
