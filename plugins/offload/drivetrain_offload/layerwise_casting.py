"""Layerwise casting: weights stored in a small dtype (an 8-bit float, say) and cast up to the compute dtype
only while their layer runs, then back (Accelerate's ``attach_layerwise_casting_hooks``)."""

from __future__ import annotations

import re
from typing import Any

import torch

from drivetrain_offload.module_hooks import ModelHook, add_hook_to_module

#: The layers whose weights are cast (normalisation and embedding layers keep their dtype, as in Accelerate).
CASTABLE_LAYERS = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d,
    torch.nn.ConvTranspose3d,
    torch.nn.Linear,
)


def _not_compiled(function: Any) -> Any:
    """Dynamo must not trace the casts (they change the module, not the graph)."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(function) if disable is not None else function


class LayerwiseCastingHook(ModelHook):
    """Keeps its module in ``storage_dtype`` and runs it in ``compute_dtype``."""

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    @_not_compiled
    def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @_not_compiled
    def post_forward(self, module: torch.nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(
    module: torch.nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | None = None,
    skip_modules_classes: tuple[type[torch.nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Attach a :class:`LayerwiseCastingHook` to every linear and convolution layer of ``module`` (``module``
    itself when it is one), except those whose qualified name matches a regular expression of
    ``skip_modules_pattern`` or whose class is in ``skip_modules_classes`` (their children are skipped too)."""
    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern

    def attach(current: torch.nn.Module, name: str) -> None:
        if skip_modules_classes is not None and isinstance(current, skip_modules_classes):
            return
        if patterns is not None and any(re.search(pattern, name) for pattern in patterns):
            return
        if isinstance(current, CASTABLE_LAYERS):
            add_hook_to_module(
                current, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True
            )
            return
        for child_name, child in current.named_children():
            attach(child, f"{name}.{child_name}" if name else child_name)

    attach(module, "")
