"""Accelerate's ``accelerate.optimizer`` path: :class:`AcceleratedOptimizer` lives in
:mod:`drivetrain.training.optimizer`."""

from drivetrain.training.optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedOptimizer"]
