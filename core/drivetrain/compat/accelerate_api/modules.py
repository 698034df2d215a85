"""Accelerate's helpers around ``torch.nn`` modules (served at ``drivetrain.utils.other``, ``.modeling`` and
``.dataclasses``): compiled regions and repeated blocks, DTensor parameters, the tensor-parallel size a model was
sharded with, modules in bottom-up order, a submodule's class by name, and whether a model is a peft model."""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch


def _compiled_type() -> type | None:
    dynamo = getattr(torch, "_dynamo", None)
    return getattr(getattr(dynamo, "eval_frame", None), "OptimizedModule", None)


def is_compiled_module(module: Any) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile`` returns."""
    compiled = _compiled_type()
    return compiled is not None and isinstance(module, compiled)


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether a submodule of ``module`` (or ``module`` itself, when it has children) was compiled."""
    return bool(module._modules) and any(is_compiled_module(submodule) for submodule in module.modules())


def is_repeated_blocks(module: torch.nn.Module) -> bool:
    """A non-empty ``ModuleList`` whose children are all of the first child's class (transformer layers)."""
    return (
        isinstance(module, torch.nn.ModuleList)
        and len(module) > 0
        and all(isinstance(child, type(module[0])) for child in module)
    )


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    return bool(module._modules) and any(is_repeated_blocks(submodule) for submodule in module.modules())


def _compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    if is_repeated_blocks(module):
        return torch.nn.ModuleList(torch.compile(block, **compile_kwargs) for block in module)
    if not has_repeated_blocks(module):
        return torch.compile(module, **compile_kwargs)
    # a shallow copy of this level (same parameters, same attributes) whose children are compiled regions;
    # bound methods stored on the instance are rebound to the copy
    copy = type(module).__new__(type(module))
    copy.__dict__.update(module.__dict__)
    for name, value in list(copy.__dict__.items()):
        if isinstance(value, MethodType) and value.__self__ is module:
            copy.__dict__[name] = MethodType(value.__func__, copy)
    copy._modules = {}
    for name, child in module.named_children():
        copy.add_module(name, _compile_regions(child, **compile_kwargs))
    return copy


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Regional compilation: each block of a repeated ``ModuleList`` is compiled on its own (the blocks share the
    compiler's cache, so compiling takes the time of one block), the parts outside repeated blocks as a whole.
    Returns a new module; the original stays reachable as ``_orig_mod`` (what unwrapping returns)."""
    compiled = _compile_regions(module, **compile_kwargs)
    compiled.__dict__.setdefault("_orig_mod", module)
    return compiled


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """Whether a parameter of ``model`` is a DTensor (sharded or replicated over a device mesh)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def get_model_tp_size(model: Any) -> int | None:
    """The tensor-parallel degree a transformers model was sharded with (``model.tp_size``, or the
    ``distributed_config`` of its config in newer transformers), None when it was not."""
    size = getattr(model, "tp_size", None)
    if size is not None:
        return size
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed, dict):
        return distributed.get("tp_size")
    return getattr(distributed, "tp_size", None)


def get_module_children_bottom_up(model: torch.nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every module of ``model``, children before their parents, ``model`` last (with ``return_fqns``,
    ``(qualified name, module)`` pairs)."""
    ordered: list[tuple[str, torch.nn.Module]] = []
    pending: list[tuple[str, torch.nn.Module]] = [("", model)]
    while pending:
        name, module = pending.pop()
        ordered.append((name, module))
        for child_name, child in module.named_children():
            pending.append((f"{name}.{child_name}" if name else child_name, child))
    ordered.reverse()
    return ordered if return_fqns else [module for _, module in ordered]


def get_module_class_from_name(module: Any, name: str) -> type | None:
    """The class named ``name`` among ``module`` and its submodules (depth first), None if absent."""
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` (once unwrapped) is a peft ``PeftModel``."""
    from drivetrain.compat.accelerate_api.availability_checks import is_peft_available

    if not is_peft_available():
        return False
    from peft import PeftModel

    from drivetrain.training.modeling import extract_model_from_parallel

    return isinstance(extract_model_from_parallel(model), PeftModel)
