"""Accelerate's import path ``accelerate.parallelism_config``: ``from drivetrain.parallelism_config import
ParallelismConfig``. The class lives in :mod:`drivetrain.config.parallelism`."""

from drivetrain.config.parallelism import ParallelismConfig

__all__ = ["ParallelismConfig"]
