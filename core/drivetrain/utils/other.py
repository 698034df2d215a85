"""Accelerate's ``accelerate.utils.other``: small helpers around modules (compiled regions, repeated blocks,
tensor-parallel size), loading with torch's weights-only unpickler, ports, dictionaries and names."""

from __future__ import annotations

import functools
import platform
import re
import socket
from collections.abc import Callable
from types import MethodType
from typing import Any

import torch

from drivetrain.contract.reexport import reexport
from drivetrain.logging import get_logger

logger = get_logger(__name__)


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


def _numpy_core() -> Any:
    import numpy

    return numpy._core if hasattr(numpy, "_core") else numpy.core


def _safe_globals() -> list[Any]:
    """What a checkpoint of RNG states and numpy arrays needs beyond torch's weights-only allowlist."""
    from codecs import encode

    import numpy

    found: list[Any] = [_numpy_core().multiarray._reconstruct, numpy.ndarray, encode, numpy.dtype]
    uint32 = getattr(getattr(numpy, "dtypes", None), "UInt32DType", None)
    if uint32 is not None:
        found.append(uint32)
    return found


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` unless asked otherwise, numpy arrays and RNG states allowed;
    torch's allowlist is as before afterwards."""
    kwargs.setdefault("weights_only", True)
    previous = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals(_safe_globals())
    try:
        return torch.load(f, map_location=map_location, **kwargs)
    finally:
        torch.serialization.clear_safe_globals()
        if previous:
            torch.serialization.add_safe_globals(previous)


def get_pretty_name(obj: Any) -> str:
    """The qualified name of ``obj`` (a class or function), else of its class."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """``source`` merged into ``destination`` (nested dictionaries merged key by key); returns ``destination``."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on ``port`` (29500, torch's default rendezvous port, when None) on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("localhost", 29500 if port is None else port)) == 0


def get_free_port() -> int:
    """A port on localhost that nothing listens on (the operating system's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def check_os_kernel() -> None:
    """Warns (main process only) on a Linux kernel older than 5.5.0, where processes can hang."""
    from packaging.version import Version

    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is None:
        return
    if Version(found.group()) < Version("5.5.0"):
        logger.warning(
            f"Detected kernel version {found.group()}, which is below the recommended minimum of 5.5.0; this can "
            "cause the process to hang. It is recommended to upgrade the kernel to the minimum version or higher.",
            main_process_only=True,
        )


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``obj.a.b.c`` for ``attr="a.b.c"``."""
    return functools.reduce(getattr, attr.split("."), obj)


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


def _lazy_constant(name: str) -> Any:
    if name == "np_core":
        return _numpy_core()
    if name == "TORCH_SAFE_GLOBALS":
        return _safe_globals()
    raise AttributeError(name)


_reexport_getattr, __dir__, _names = reexport(
    __name__,
    {
        "clean_state_dict_for_safetensors": "drivetrain.checkpointing",
        "save": "drivetrain.checkpointing",
        "convert_bytes": "drivetrain.commands.estimate_memory",
        "extract_model_from_parallel": "drivetrain.training.modeling",
        "wait_for_everyone": "drivetrain.utils._process",
        "write_basic_config": "drivetrain.config.file",
    },
)


def __getattr__(name: str) -> Any:
    if name in ("np_core", "TORCH_SAFE_GLOBALS"):  # numpy is imported only when these are asked for
        return _lazy_constant(name)
    return _reexport_getattr(name)


_CALLABLES: list[Callable] = [
    value for value in list(globals().values()) if getattr(value, "__module__", None) == __name__
]
__all__ = sorted(
    {
        *_names,
        "logger",
        "np_core",
        "TORCH_SAFE_GLOBALS",
        *(f.__name__ for f in _CALLABLES if not f.__name__.startswith("_")),
    }
)
