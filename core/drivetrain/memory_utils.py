"""Accelerate's ``accelerate.memory_utils``: the old home of ``find_executable_batch_size`` (now in
``utils.memory``). The path still imports, with the FutureWarning Accelerate gives, and holds nothing."""

import warnings

warnings.warn(
    "memory_utils moved to utils.memory: import find_executable_batch_size from the package itself "
    "(`from drivetrain import find_executable_batch_size`) to avoid this warning.",
    FutureWarning,
    stacklevel=2,
)
