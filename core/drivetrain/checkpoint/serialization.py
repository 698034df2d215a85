"""Reading and writing tensors: safetensors streamed tensor by tensor, and pickles loaded safely.

Why our own safetensors writer: ``safetensors.torch.save_file`` first turns every tensor into a ``bytes``
copy, so saving needs twice the model's memory. The format is simple (an 8-byte header length, a JSON
header, the raw bytes), so we write each tensor's buffer straight from memory. The
files are ordinary safetensors files that ``safetensors``/``transformers`` read.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from drivetrain.checkpoint.files import checkpoint_writer
from drivetrain.errors import CheckpointError
from drivetrain.safetensors_reader import SAFETENSORS_DTYPES, TensorReader, read_header

#: safetensors' dtype names, by torch dtype (the reader's table, inverted: one list of what the format holds).
_SAFETENSORS_DTYPES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}

#: How the opt-out of safe unpickling is spelled in errors and docs.
UNSAFE_OPT_OUT = "load_kwargs={'weights_only': False}"


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Identity of the memory a tensor views: tensors with equal keys are the same weight (tied)."""
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except RuntimeError:
        # A lazy device's tensor (XLA) has no storage to point at: tied weights are one tensor object there.
        return (tensor.device, id(tensor))
    return (
        tensor.device,
        pointer,
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def deduplicate_shared(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop the second and later names of tensors that are the same memory (tied weights).

    Returns the tensors to write and ``{dropped_name: kept_name}``. Tensors that overlap without being
    identical (a slice of another) are kept under every name; the writer copies them out separately.
    """
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first_name: dict[tuple[Any, ...], str] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(
                f"state dict entry {name!r} is a {type(tensor).__name__}, not a tensor: safetensors stores "
                "tensors only (save with safe_serialization=False to pickle other values)"
            )
        if tensor.device.type == "meta":
            raise CheckpointError(f"tensor {name!r} is on the 'meta' device and has no data to save")
        key = _storage_key(tensor)
        if key in first_name:
            aliases[name] = first_name[key]
        else:
            first_name[key] = name
            kept[name] = tensor
    return kept, aliases


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as a buffer, without a copy when it is a contiguous CPU tensor."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    tensor = tensor.contiguous().reshape(-1)
    if tensor.numel() == 0:
        return memoryview(b"")
    return memoryview(tensor.view(torch.uint8).numpy()).cast("B")


def save_safetensors(
    tensors: Mapping[str, torch.Tensor],
    path: str,
    metadata: Mapping[str, str] | None = None,
    durable: bool = False,
) -> None:
    """Write ``tensors`` (tied names already removed, see :func:`deduplicate_shared`) as a safetensors file,
    streaming each tensor's memory to disk; ``durable`` fsyncs it before returning (a checkpoint's files
    are fsynced together when the save finishes)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned, as safetensors writes it
    with checkpoint_writer(path, durable=durable) as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for tensor in tensors.values():
            out.write(_raw_bytes(tensor))


def save_safetensors_atomically(tensors: Mapping[str, torch.Tensor], path: str) -> None:
    """:func:`save_safetensors` into a temporary sibling renamed over ``path``: readers never see half a file."""
    path = os.path.abspath(path)
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.partial")
    try:
        save_safetensors(tensors, temporary, metadata={"format": "pt"}, durable=True)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _shared_groups(state_dict: Mapping[str, torch.Tensor]) -> dict[str, list[str]]:
    """For each name of a module's state dict, every name that is the same tensor (itself included)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor):
            groups.setdefault(_storage_key(tensor), []).append(name)
    return {name: names for names in groups.values() for name in names}


def load_safetensors_into_module(module: torch.nn.Module, paths: Iterable[str], strict: bool = True) -> None:
    """Copy the tensors of safetensors files into ``module``'s parameters and buffers (memory: nothing
    beyond the model). Tied weights saved once fill every name they are shared under.

    Each tensor is read from the file straight into the parameter's memory, on a few threads, by the same
    reader big-model loading uses (casting on the way when the dtypes differ); a damaged or truncated file
    fails with a :class:`CheckpointError` naming it before anything is read from it."""
    paths = list(paths)
    targets = module.state_dict(keep_vars=True)
    groups = _shared_groups(targets)
    if not _state_dict_is_own_tensors(module, targets):
        _load_through_state_dict(module, paths, groups, strict)
        return
    loaded: set[str] = set()
    unexpected: list[str] = []
    mismatched: list[str] = []
    with torch.no_grad(), TensorReader() as reader:
        for path in paths:
            for name, record in read_header(path).items():
                target = targets.get(name)
                if target is None:
                    unexpected.append(name)
                    continue
                if tuple(target.shape) != record.shape:
                    mismatched.append(f"{name}: checkpoint {record.shape}, model {tuple(target.shape)}")
                    continue
                reader.read(path, record, target, name)
                loaded.update(groups.get(name, [name]))
            reader.wait(path)
    missing = [name for name in targets if name not in loaded]
    problems = []
    if mismatched:
        problems.append("shape mismatch for " + "; ".join(mismatched))
    if strict and missing:
        problems.append(f"missing keys {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    if strict and unexpected:
        problems.append(f"unexpected keys {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
    if problems:
        raise CheckpointError(
            f"cannot load {', '.join(paths)} into {type(module).__name__}: " + "; ".join(problems)
        )


def _state_dict_is_own_tensors(module: torch.nn.Module, state_dict: Mapping[str, Any]) -> bool:
    """Whether every tensor of ``module.state_dict(keep_vars=True)`` is one of its parameters or buffers.
    Not so when a state-dict hook or a patched ``state_dict`` hands out converted copies (weights kept in a
    packed layout, or in bf16 with fp32 master copies elsewhere): writing into those copies loads nothing."""
    own = {id(tensor) for tensor in (*module.parameters(), *module.buffers())}
    return all(id(value) in own for value in state_dict.values() if isinstance(value, torch.Tensor))


def _load_through_state_dict(
    module: torch.nn.Module, paths: list[str], groups: Mapping[str, list[str]], strict: bool
) -> None:
    """Read the files into memory and hand them to ``module.load_state_dict``, whose own loading logic
    converts them back (the slow path, for modules whose state dict is not their own tensors)."""
    from safetensors.torch import load_file

    values: dict[str, torch.Tensor] = {}
    for path in paths:
        values.update(load_file(path))
    for name, names in groups.items():
        if name not in values:  # a tied weight saved under another of its names
            saved = next((other for other in names if other in values), None)
            if saved is not None:
                values[name] = values[saved]
    try:
        module.load_state_dict(values, strict=strict)
    except RuntimeError as exc:
        problem = " ".join(str(exc).split())
        raise CheckpointError(
            f"cannot load {', '.join(paths)} into {type(module).__name__}: {problem}"
        ) from None


def _numpy_safe_globals() -> list[Any]:
    """numpy types that RNG states contain; rebuilding them runs no user code."""
    try:
        import numpy as np
    except ImportError:
        return []
    found: list[Any] = [np.ndarray, np.dtype]
    multiarray = getattr(getattr(np, "_core", None), "multiarray", None) or np.core.multiarray
    found.append(multiarray._reconstruct)
    found.extend(type(np.dtype(name)) for name in ("uint32", "int64", "float64", "uint8"))
    return found


def safe_load(path: str, map_location: Any = None, weights_only: bool = True, **kwargs: Any) -> Any:
    """``torch.load`` that refuses to run code: ``weights_only=True`` unless the caller explicitly opts out.

    A file that needs more than tensors, containers and numbers fails with a :class:`CheckpointError` naming
    it and the opt-out; nothing in the file runs.
    """
    if not weights_only:
        return torch.load(path, map_location=map_location, weights_only=False, **kwargs)
    try:
        return _weights_only_load(path, map_location, **kwargs)
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} disappeared while it was being loaded: another run may have pruned or replaced the "
            "checkpoint"
        ) from None


def _weights_only_load(path: str, map_location: Any, **kwargs: Any) -> Any:
    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        lines = str(exc).splitlines()
        # torch's first line is generic; the line naming the refused global says what was in the file.
        reason = next(
            (line for line in lines if "GLOBAL" in line or "Unsupported" in line), lines[0] if lines else ""
        )
        raise CheckpointError(
            f"{path} holds objects that safe loading refuses ({reason.strip()}); nothing in it was "
            f"run. If you trust where this file came from, load it with {UNSAFE_OPT_OUT} "
            "(load_state) or weights_only=False"
        ) from exc
    except (RuntimeError, EOFError, ValueError, KeyError, IndexError, TypeError, OverflowError) as exc:
        if isinstance(exc, RuntimeError) and kwargs.get("mmap") and "mmap" in str(exc):
            raise  # a file torch cannot map: the caller reads it whole instead
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointError(
            f"{path} is damaged and cannot be read ({type(exc).__name__}: {first_line})"
        ) from exc


def plan_shards(tensors: Mapping[str, torch.Tensor], max_shard_size: int) -> list[list[str]]:
    """Group names into shards of at most ``max_shard_size`` bytes, in order; a tensor larger than the limit
    gets a shard of its own."""
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if current and current_size + size > max_shard_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current or not shards:
        shards.append(current)
    return shards
