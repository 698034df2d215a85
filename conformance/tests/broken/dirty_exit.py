"""Breaks clean_exit: the process exits with code 3 after the script finished."""

import atexit
import os

from drivetrain import hookimpl
from drivetrain.backends.local import PLUGIN_INFO  # noqa: F401
from drivetrain.config.enums import DistributedType
from drivetrain.contract.environment import DistributedEnvironment


@hookimpl
def setup_process_group(device):
    atexit.register(os._exit, 3)
    return DistributedEnvironment(distributed_type=DistributedType.NO)
