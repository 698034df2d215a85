"""Finding the user's module inside the wrappers that plugins and torch.compile put around it."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

#: Attribute (set outside nn.Module's registry, so it is not a submodule) linking a wrapper to the module
#: that was passed to ``Accelerator.prepare``.
ORIGINAL_MODULE_ATTRIBUTE = "_drivetrain_original_module"
ORIGINAL_FORWARD_ATTRIBUTE = "_drivetrain_original_forward"


def remember_original(wrapped: Any, original: torch.nn.Module) -> None:
    """Record on ``wrapped`` which module the user passed in (plugins convert in place or wrap)."""
    if wrapped is not original:
        object.__setattr__(wrapped, ORIGINAL_MODULE_ATTRIBUTE, original)


def patch_forward_with_autocast(model: torch.nn.Module, autocast_context: Callable[[], Any]) -> None:
    """Run ``model.forward`` under ``autocast_context()`` and return fp32 outputs; undone by
    :func:`restore_forward` (``unwrap_model(keep_fp32_wrapper=False)``)."""
    from drivetrain.operations import convert_to_fp32

    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with autocast_context():
            outputs = original(*args, **kwargs)
        return convert_to_fp32(outputs)

    model.__dict__[ORIGINAL_FORWARD_ATTRIBUTE] = original
    model.forward = forward  # type: ignore[method-assign]


def restore_forward(model: torch.nn.Module) -> None:
    """Undo the mixed-precision forward patch that ``prepare_model`` applied."""
    original = model.__dict__.pop(ORIGINAL_FORWARD_ATTRIBUTE, None)
    if original is None:
        original = _accelerate_original_forward(model)
    if original is None:
        return
    if isinstance(original, types.MethodType) and original.__self__ is model:
        model.__dict__.pop("forward", None)
    else:
        model.forward = original  # type: ignore[method-assign]


def _accelerate_original_forward(model: torch.nn.Module) -> Any:
    """The forward that Accelerate-style code saved in ``_original_forward`` before wrapping ``model.forward``
    (e.g. with ``convert_outputs_to_fp32``), when the current forward's ``__wrapped__`` chain leads back to it;
    None otherwise (a forward replaced by something else is left alone)."""
    original = model.__dict__.pop("_original_forward", None)
    forward = model.__dict__.get("forward")
    if original is None or forward is None:
        return None
    while forward is not None and forward != original:
        forward = getattr(forward, "__wrapped__", None)
    return original if forward is not None else None


def extract_model_from_parallel(
    model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
) -> Any:
    """The user's module inside ``model``: peels torch.compile, plugin wrappers and torch's data-parallel
    wrappers. With ``keep_fp32_wrapper=False`` the mixed-precision forward patch is removed too."""
    compiled = model if hasattr(model, "_orig_mod") else None
    inner = model._orig_mod if compiled is not None else model
    while True:
        if ORIGINAL_MODULE_ATTRIBUTE in getattr(inner, "__dict__", {}):
            inner = inner.__dict__[ORIGINAL_MODULE_ATTRIBUTE]
        elif isinstance(inner, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            inner = inner.module
        else:
            break
    if not keep_fp32_wrapper:
        restore_forward(inner)
    if keep_torch_compile and compiled is not None:
        if inner is compiled._orig_mod:
            return compiled
        # torch.compile(DDP(model)): the user's module under the same compile settings, as a new wrapper
        # (the training model keeps its data-parallel wrapper; Accelerate rewires the one it was given).
        return type(compiled)(inner, compiled.dynamo_ctx)
    return inner
