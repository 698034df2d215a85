"""``deepspeed.zero.Init`` for one configuration: parameters created already partitioned (ZeRO stage 3)."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import Any

from drivetrain_deepspeed.autofill import resolve_precision
from drivetrain_deepspeed.library import check_precision_supported, import_deepspeed


def zero_init_config(plugin: Any, mixed_precision: str) -> dict[str, Any]:
    """What ``zero.Init`` needs of ``plugin``'s config: its ZeRO section without "auto" entries, the precision
    resolved against ``mixed_precision``, and consistent placeholder batch sizes (``zero.Init`` validates the
    whole config but reads only the ZeRO section and the dtype)."""
    config = copy.deepcopy(plugin.deepspeed_config)
    precision = resolve_precision(config, mixed_precision)
    init_config: dict[str, Any] = {
        "zero_optimization": {
            key: value for key, value in config.get("zero_optimization", {}).items() if value != "auto"
        },
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
    }
    for part in ("offload_optimizer", "offload_param"):
        section = init_config["zero_optimization"].get(part)
        if isinstance(section, dict) and section.get("device") == "auto":
            section["device"] = "none"
    return init_config


@contextlib.contextmanager
def partitioned_init(plugin: Any, mixed_precision: str, enabled: bool = True) -> Iterator[None]:
    """Inside the block, parameters are created partitioned when ``plugin`` (a ``DeepSpeedPlugin``) is ZeRO
    stage 3 and ``enabled``; otherwise the block runs as it is."""
    if not enabled or plugin.stage != 3:
        yield
        return
    init_config = zero_init_config(plugin, mixed_precision)
    precision = (
        "bf16" if init_config["bf16"]["enabled"] else "fp16" if init_config["fp16"]["enabled"] else "no"
    )
    device_type = "cpu" if os.environ.get("DS_ACCELERATOR") == "cpu" else None
    deepspeed = import_deepspeed(device_type or "cuda")
    check_precision_supported(precision, mixed_precision)
    # The dtype goes through the config: zero.Init ignores its dtype= argument on devices without fp16.
    with deepspeed.zero.Init(config_dict_or_path=init_config):
        yield
