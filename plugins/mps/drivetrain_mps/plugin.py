"""The mps plugin's hooks: the ``mps`` device when it is there, one process, the precisions it supports.

Chosen automatically when ``torch.backends.mps.is_available()`` and the CPU is not forced, as Accelerate
does. Every hook answers only for the mps device, so on other machines installing the plugin changes
nothing. Forward passes run under the reference backend's ``torch.autocast("mps", dtype)``; this plugin
checks first that the precision is one mps autocast supports, since torch itself only warns and runs in fp32.
"""

from __future__ import annotations

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import (
    Capabilities,
    ConfigurationError,
    PluginAccelerator,
    PluginInfo,
    environment_world_size,
)

PLUGIN_INFO = PluginInfo(
    kind="device",
    description="Apple-silicon GPUs through torch's mps device (chosen when present; one process)",
    capabilities=Capabilities(multi_process=False, precisions=("no", "fp16", "bf16"), devices=("mps",)),
)

#: mixed_precision values torch's mps autocast supports (bf16 from macOS 14 on).
MPS_PRECISIONS = ("no", "fp16", "bf16")


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def check_precision(accelerator: PluginAccelerator) -> None:
    """A one-line error for a precision the mps device cannot run (torch would warn and run in fp32)."""
    if accelerator.device.type != "mps":
        return
    precision = accelerator.mixed_precision
    if precision not in MPS_PRECISIONS:
        raise ConfigurationError(
            f"mixed_precision={precision!r} is not supported on the mps device (valid there: "
            f"{', '.join(MPS_PRECISIONS)}); or pass cpu=True / --cpu"
        )
    if precision == "bf16" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise ConfigurationError(
            "mixed_precision='bf16' on the mps device needs macOS 14 or later (torch's mps autocast has no "
            "bf16 before); use mixed_precision='fp16'"
        )


@hookimpl
def detect_device(cpu: bool) -> torch.device | None:
    if cpu or not mps_available():
        return None
    return torch.device("mps")


@hookimpl
def setup_process_group(device: torch.device) -> None:
    # Never answers (the backend does); refuses what mps cannot do before a backend tries.
    world_size = environment_world_size()
    if device.type == "mps" and world_size > 1:
        raise ConfigurationError(
            f"the mps device runs one process, but this script was started as {world_size} processes: torch's "
            "process groups (gloo, nccl) do not work with mps; start one process, or pass --cpu to train on "
            f"the CPU in {world_size} processes"
        )


@hookimpl
def wrap_model(accelerator: PluginAccelerator) -> None:
    check_precision(accelerator)  # at prepare(), before the first forward pass


@hookimpl
def autocast(accelerator: PluginAccelerator) -> None:
    check_precision(accelerator)  # then the reference backend's torch.autocast("mps", dtype) answers
