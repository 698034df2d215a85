"""Accelerate's module name for the data-loading classes; they live in :mod:`drivetrain.data`."""

from drivetrain.data import *  # noqa: F403
from drivetrain.data import __all__  # noqa: F401
