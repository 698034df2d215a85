"""Importing deepspeed itself, and what must be true of this machine for it (nothing else in the plugin
imports deepspeed at module level, so listing plugins and parsing launch options stay fast)."""

from __future__ import annotations

import os
from typing import Any

from drivetrain.plugin_api import ConfigurationError


def import_deepspeed(device_type: str = "cpu") -> Any:
    """Import deepspeed, telling it to run on the CPU when this process computes there (it would otherwise
    pick CUDA whenever it sees a GPU, or fail to find an accelerator)."""
    if device_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed


def check_precision_supported(precision: str, mixed_precision: str) -> None:
    """Refuse, naming the precision and what would be valid, a 16-bit type DeepSpeed's accelerator does not
    support here (DeepSpeed's own check is a bare "Type fp16 is not supported on your device."). On CPU,
    fp16 needs oneDNN fp16 kernels (CPUs with AVX512-FP16/AMX-FP16); bf16 is always available."""
    if precision not in ("fp16", "bf16"):
        return
    from deepspeed.accelerator import get_accelerator

    device = get_accelerator()
    supported = {"bf16": bool(device.is_bf16_supported()), "fp16": bool(device.is_fp16_supported())}
    if supported[precision]:
        return
    source = (
        f"mixed_precision={precision!r}"
        if mixed_precision == precision
        else f'the DeepSpeed config\'s "{precision}": {{"enabled": true}}'
    )
    valid = ", ".join(repr(name) for name in ("no", "bf16", "fp16") if name == "no" or supported[name])
    raise ConfigurationError(
        f"{source} with the deepspeed backend: DeepSpeed does not support {precision} on this "
        f"{device.device_name()} device; valid mixed_precision here: {valid}"
    )
