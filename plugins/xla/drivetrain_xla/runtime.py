"""torch_xla, imported only when an XLA device is in use, and the few calls of it this plugin makes.

torch_xla 2.9 names: ``torch_xla.device()``, ``torch_xla.sync()`` (``xm.mark_step`` is deprecated),
``torch_xla.runtime`` (``xr``) for world size, ordinals and SPMD. Importing torch_xla with ``PJRT_DEVICE``
unset logs "Defaulting to PJRT_DEVICE=CPU" and sets that variable, so whether XLA was *asked for* is read
from the environment before the first import (:func:`device_requested`).
"""

from __future__ import annotations

import functools
import os
from importlib import metadata
from typing import Any

import torch

#: Environment variables that say an XLA runtime was asked for (torch_xla's PJRT selection, and the ones a
#: TPU VM or a TPU pod launcher sets).
REQUEST_VARIABLES = ("PJRT_DEVICE", "TPU_NAME", "XRT_TPU_CONFIG")
#: Read when this module is imported (before torch_xla, whose import sets PJRT_DEVICE=CPU when unset), so
#: that torch_xla's own default never looks like a user's request.
_REQUESTED_AT_START = {name: os.environ.get(name) for name in REQUEST_VARIABLES}


def device_requested() -> str | None:
    """Why this process should compute on an XLA device (the variable that asks for it), or None."""
    for name, value in _REQUESTED_AT_START.items():
        if value:
            return f"{name}={value}"
    return None


def torch_xla_problem() -> str | None:
    """Why torch_xla cannot be used with this torch, from package metadata (no import), or None."""
    try:
        version = metadata.version("torch-xla")
    except metadata.PackageNotFoundError:
        try:
            version = metadata.version("torch_xla")
        except metadata.PackageNotFoundError:
            return "torch_xla is not installed (pip install drivetrain-xla[xla]; see docs/xla.md)"
    torch_version = torch.__version__.split("+")[0]
    if version.split("+")[0].split(".")[:2] != torch_version.split(".")[:2]:
        return (
            f"torch_xla {version} needs torch {'.'.join(version.split('.')[:2])}, but torch is {torch.__version__} "
            "(each torch_xla release works with the torch release of the same number)"
        )
    return None


@functools.cache
def modules() -> Any:
    """``(torch_xla, xm, xr)``, imported once. Raises ImportError naming what is missing."""
    problem = torch_xla_problem()
    if problem is not None:
        raise ImportError(f"drivetrain-xla: {problem}")
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    return torch_xla, xm, xr


def start() -> int:
    """Start torch_xla's runtime (it then counts its devices); returns the number of devices."""
    return int(modules()[2].global_runtime_device_count())


def sync() -> None:
    """Cut the graph recorded so far and run it (``torch_xla.sync()``, formerly ``xm.mark_step()``)."""
    modules()[0].sync()


def device() -> torch.device:
    return modules()[0].device()


def device_type() -> str:
    """The PJRT device type: ``"TPU"``, ``"CPU"``, ``"CUDA"``..."""
    return str(modules()[2].device_type())


def is_spmd() -> bool:
    return bool(modules()[2].is_spmd())


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Accelerate's check: torch_xla imports with this torch (and, when asked, its device is a TPU or a GPU).

    Answers from package metadata first, so a torch_xla built for another torch gives False rather than an
    import error; imports torch_xla only when it can work."""
    if check_is_tpu and check_is_gpu:
        raise ValueError("is_torch_xla_available: pass check_is_tpu or check_is_gpu, not both")
    if torch_xla_problem() is not None:
        return False
    try:
        modules()
    except Exception:
        return False
    if check_is_tpu:
        return device_type() == "TPU"
    if check_is_gpu:
        return device_type() in ("GPU", "CUDA")
    return True
