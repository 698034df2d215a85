"""Intel XPUs through torch's own ``xpu`` device, and the process-group backends for Intel hardware.

No IPEX is needed for any of this: torch (2.4 and later) has the ``xpu`` device and, from 2.8 on builds with
XPU support, the ``xccl`` process-group backend, which the ddp backend picks for XPU devices. oneCCL's
``ccl`` backend (``oneccl_bind_pt``, published on Intel's package index, not on PyPI) is used when the script
asks for it with ``InitProcessGroupKwargs(backend="ccl")``: importing its bindings registers it with torch.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError
from drivetrain_ipex.settings import USE_XPU, Request

#: The module that registers the ``ccl`` backend with torch.distributed, and where to get it.
ONECCL_MODULE = "oneccl_bindings_for_pytorch"
ONECCL_INSTALL = "pip install oneccl_bind_pt --extra-index-url https://pytorch-extension.intel.com/release-whl/stable/cpu/us/"


def xpu_available() -> bool:
    """Whether torch sees an Intel XPU (False on torch builds without XPU support)."""
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def xccl_available() -> bool:
    """Whether this torch has the ``xccl`` process-group backend (torch 2.8+ built with XPU support)."""
    import torch.distributed as dist

    check = getattr(dist, "is_xccl_available", None)
    return bool(check is not None and check())


def detect_device(local_process_index: int, cpu: bool, request: Request) -> torch.device | None:
    """``xpu:<local rank>`` when an XPU is visible and the CPU was not forced; None lets the next plugin
    answer. Accelerate's ``use_xpu`` makes a missing XPU an error instead of a silent CPU run."""
    if cpu:
        if request.use_xpu:
            raise ConfigurationError(
                f"{USE_XPU} asks for the Intel XPU, but cpu=True (or --cpu) asks for the CPU; drop one"
            )
        return None
    if xpu_available():
        return torch.device("xpu", local_process_index % torch.xpu.device_count())
    if request.use_xpu:
        raise ConfigurationError(
            f"{USE_XPU}: no Intel XPU is visible (torch.xpu.is_available() is False: torch "
            f"{torch.__version__} has no XPU support or no XPU driver is loaded); remove it to train on the CPU"
        )
    return None


def check_process_group(device: torch.device, init_kwargs: dict[str, Any], world_size: int) -> None:
    """Make the process-group backend the run needs available, or say in one line why it is not."""
    backend = init_kwargs.get("backend")
    if backend == "ccl":
        try:
            __import__(ONECCL_MODULE)
        except ImportError as exc:
            raise ConfigurationError(
                f"InitProcessGroupKwargs(backend='ccl') needs oneCCL's torch bindings ({ONECCL_MODULE}: "
                f"{exc}); they are not on PyPI: {ONECCL_INSTALL}, or leave backend unset for gloo/xccl"
            ) from None
        return
    if device.type == "xpu" and world_size > 1 and backend is None and not xccl_available():
        raise ConfigurationError(
            f"{world_size} processes on Intel XPUs need torch's xccl process-group backend, which torch "
            f"{torch.__version__} lacks (it comes with torch 2.8+ built for XPU); or use oneCCL: "
            f"InitProcessGroupKwargs(backend='ccl') with {ONECCL_INSTALL}"
        )
