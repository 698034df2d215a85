"""The part of Accelerate's ``accelerate.test_utils`` that other libraries' test suites reach for (peft's and
trl's import it to pick the device their tests run on): :mod:`drivetrain.test_utils.testing`. Accelerate's own
test fixtures (regression models, ``require_*`` decorators, multi-process scripts) are not shipped.
"""

from drivetrain.test_utils.testing import SubprocessCallException, get_backend, run_command

__all__ = ["SubprocessCallException", "get_backend", "run_command"]
