"""TEMPORARY local shim for compat-behaviour testing."""

from drivetrain.utils import *  # noqa: F403
from drivetrain.config.enums import DistributedType  # noqa: F401
