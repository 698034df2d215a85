"""What ``prepare`` admits: the kind of each object it is given, and which models can train.

A model quantized to 8 or 4 bits (``is_loaded_in_8bit`` / ``is_loaded_in_4bit``, set by the quantization
library) cannot be trained with modules offloaded to the CPU or to disk by its ``hf_device_map``, as in
Accelerate: those modules' weights have no gradients there. The one exception is a quantization library built
for several backends, which computes on the CPU as well, so CPU modules train (unless the accelerator is one
that library does not pair with CPU modules).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from drivetrain.compat.availability import QUANTIZED_CPU_EXCLUDED_DEVICE


def quantization_computes_on_cpu() -> bool:
    """Whether the installed bitsandbytes is its multi-backend build (which computes on the CPU too); imports
    it only when it is installed (Accelerate's ``is_bitsandbytes_multi_backend_available``)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return False
    return "multi_backend" in getattr(importlib.import_module("bitsandbytes"), "features", set())


def excluded_device_available() -> bool:
    """Whether this machine has the accelerator beside which that library does not train CPU modules
    (Accelerate's ``is_xpu_available``)."""
    device = getattr(torch, QUANTIZED_CPU_EXCLUDED_DEVICE, None)
    return bool(device is not None and device.is_available())


def check_trainable(model: torch.nn.Module, cpu_modules_train: Callable[[], bool]) -> None:
    """Refuse a quantized ``model`` whose device map offloads modules it could not train. ``cpu_modules_train``
    answers whether modules on the CPU train here; it is asked only for such a model (it may import the
    quantization library, after which forking is refused)."""
    quantized = getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)
    if not quantized:
        return
    offloaded = {str(device) for device in getattr(model, "hf_device_map", {}).values()} & {"cpu", "disk"}
    if "cpu" in offloaded and cpu_modules_train():
        offloaded.discard("cpu")
    if offloaded:
        raise ValueError(
            "a model loaded in 8-bit or 4-bit precision cannot be trained with CPU or disk offload (its "
            f"hf_device_map puts modules on {', '.join(sorted(offloaded))}); load it with every module on "
            "the accelerator (device_map={'': <device index>})"
        )


def kind_of(obj: Any) -> str | None:
    """What ``prepare`` takes ``obj`` for: ``"model"``, ``"optimizer"``, ``"dataloader"``, ``"scheduler"``
    (torch's, or any object with ``step``, ``optimizer`` and ``state_dict``), or None (returned unchanged)."""
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, torch.utils.data.DataLoader):
        return "dataloader"
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "state_dict")
    ):
        return "scheduler"
    return None


def spans_several_devices(module: torch.nn.Module) -> bool:
    """Whether ``module`` was dispatched across several devices with a device map (``hf_device_map``)."""
    return len(set(getattr(module, "hf_device_map", {}).values())) > 1
