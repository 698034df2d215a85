"""Accelerate's ``accelerate.test_utils.testing`` helpers that other libraries' test suites import (served at
``drivetrain.test_utils`` and ``drivetrain.test_utils.testing``): peft's test helpers pick their device with
:func:`get_backend` when they are imported, and run example scripts with :func:`run_command`. Accelerate's own
test fixtures (regression models, ``require_*`` decorators, multi-process scripts) are not shipped;
drivetrain's own multi-process test helpers are in :mod:`drivetrain.testing`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


class SubprocessCallException(Exception):
    """A command run by :func:`run_command` exited with an error; the message holds its output."""


def get_backend() -> tuple[str, int, Callable[..., int]]:
    """``(device type, device count, memory allocated)`` for tests: the accelerator torch reports
    (``"cuda"``, ``"xpu"``, ``"mps"``, ...) with ``torch.accelerator``'s count and allocated-memory function,
    or ``("cpu", 1, <function returning 0>)`` without one, as Accelerate's answers."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        device = accelerator.current_accelerator()
        if device is not None:
            return device.type, accelerator.device_count(), accelerator.memory_allocated
    return "cpu", 1, lambda *args, **kwargs: 0


def run_command(
    command: Sequence[str | os.PathLike], return_stdout: bool = False, env: dict[str, str] | None = None
) -> str | None:
    """Run ``command`` (paths become strings), stdout and stderr together. Returns the output decoded when
    ``return_stdout``; a non-zero exit raises :class:`SubprocessCallException` with the command and its output."""
    arguments = [str(part) if isinstance(part, Path) else part for part in command]
    try:
        output = subprocess.check_output(
            arguments, stderr=subprocess.STDOUT, env=os.environ.copy() if env is None else env
        )
    except subprocess.CalledProcessError as error:
        raise SubprocessCallException(
            f"Command `{' '.join(map(str, arguments))}` failed with the following error:\n\n"
            f"{error.output.decode(errors='replace')}"
        ) from error
    return output.decode("utf-8") if return_stdout else None
