"""Imported when ``drivetrain.memory_utils`` is (drivetrain.compat.paths.ON_IMPORT): Accelerate's
``accelerate.memory_utils`` is the old home of ``find_executable_batch_size`` (now in ``utils.memory``); the path
still imports, with the FutureWarning Accelerate gives, and holds nothing."""

import warnings

warnings.warn(
    "memory_utils moved to utils.memory: import find_executable_batch_size from the package itself "
    "(`from drivetrain import find_executable_batch_size`) to avoid this warning.",
    FutureWarning,
    # the line that imported drivetrain.memory_utils: past this module, the generated module's loader
    # (drivetrain.contract.reexport) and its importlib.import_module (import machinery frames do not count)
    stacklevel=4,
)
