"""Accelerate's ``accelerate.utils.operations`` path (TEMPORARY local shim for compat-behaviour testing)."""

from drivetrain.operations import *  # noqa: F403
from drivetrain.operations import DistributedOperationException, copy_tensor_to_devices  # noqa: F401
