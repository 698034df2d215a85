"""Reading and writing tensors: safetensors streamed tensor by tensor, and pickles loaded safely.

Why our own safetensors writer: ``safetensors.torch.save_file`` first turns every tensor into a ``bytes``
copy, so saving needs twice the model's memory. The format is simple (an 8-byte header length, a JSON
header, the raw bytes), so we write each tensor's buffer straight from memory, hashing it on the way. The
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

from drivetrain import units
from drivetrain.checkpoint.files import durable_writer
from drivetrain.errors import CheckpointError

_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.complex64: "C64",
}

#: How the opt-out of safe unpickling is spelled in errors and docs.
UNSAFE_OPT_OUT = "load_kwargs={'weights_only': False}"


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Identity of the memory a tensor views: tensors with equal keys are the same weight (tied)."""
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
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
    hashed: bool = True,
) -> None:
    """Write ``tensors`` (tied names already removed, see :func:`deduplicate_shared`) as a safetensors file,
    streaming each tensor's memory to disk, hashed and fsynced on the way."""
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
    with durable_writer(path, hashed=hashed) as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for tensor in tensors.values():
            out.write(_raw_bytes(tensor))


def save_safetensors_atomically(tensors: Mapping[str, torch.Tensor], path: str) -> None:
    """:func:`save_safetensors` into a temporary sibling renamed over ``path``: readers never see half a file."""
    path = os.path.abspath(path)
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.partial")
    try:
        save_safetensors(tensors, temporary, metadata={"format": "pt"}, hashed=False)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def read_safetensors_header(path: str) -> dict[str, Any]:
    """The JSON header of a safetensors file (names, dtypes, shapes), with a clear error when it is not one."""
    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > os.path.getsize(path):
                raise ValueError("header length beyond end of file")
            return json.loads(handle.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc


def _shared_groups(state_dict: Mapping[str, torch.Tensor]) -> dict[str, list[str]]:
    """For each name of a module's state dict, every name that is the same tensor (itself included)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor):
            groups.setdefault(_storage_key(tensor), []).append(name)
    return {name: names for names in groups.values() for name in names}


def _writable_bytes(target: torch.Tensor, entry: Any) -> memoryview | None:
    """``target``'s memory as a writable byte buffer when a file's tensor ``entry`` can be read straight
    into it (CPU, contiguous, same dtype, shape and size), else None."""
    if (
        target.device.type != "cpu"
        or not target.is_contiguous()
        or target.numel() == 0
        or _SAFETENSORS_DTYPES.get(target.dtype) != entry.get("dtype")
        or list(target.shape) != list(entry.get("shape", ()))
    ):
        return None
    begin, end = entry["data_offsets"]
    if end - begin != target.numel() * target.element_size():
        return None
    return memoryview(target.detach().reshape(-1).view(torch.uint8).numpy()).cast("B")


def _read_exactly(handle: Any, offset: int, into: memoryview, path: str, name: str) -> None:
    handle.seek(offset)
    filled = 0
    while filled < len(into):
        count = handle.readinto(into[filled:])
        if not count:
            raise CheckpointError(f"{path} ends inside tensor {name!r}: the file is truncated")
        filled += count


def load_safetensors_into_module(module: torch.nn.Module, paths: Iterable[str], strict: bool = True) -> None:
    """Copy the tensors of safetensors files into ``module``'s parameters and buffers one at a time (memory:
    one tensor beyond the model). Tied weights saved once fill every name they are shared under.

    A CPU tensor of the same dtype and shape is read from the file straight into the parameter's memory (one
    copy from the page cache, no mapping); anything else goes through ``safetensors.safe_open``."""
    from safetensors import safe_open

    paths = list(paths)
    targets = module.state_dict(keep_vars=True)
    groups = _shared_groups(targets)
    loaded: set[str] = set()
    unexpected: list[str] = []
    mismatched: list[str] = []
    with torch.no_grad():
        for path in paths:
            header = read_safetensors_header(path)
            with open(path, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
            data_start = 8 + length
            indirect: list[str] = []
            with open(path, "rb", buffering=0) as handle:
                for name, entry in header.items():
                    if name == "__metadata__":
                        continue
                    target = targets.get(name)
                    if target is None:
                        unexpected.append(name)
                        continue
                    into = _writable_bytes(target, entry)
                    if into is None:
                        indirect.append(name)
                        continue
                    _read_exactly(handle, data_start + entry["data_offsets"][0], into, path, name)
                    loaded.update(groups.get(name, [name]))
            if not indirect:
                continue
            with safe_open(path, framework="pt", device="cpu") as handle:
                for name in indirect:
                    target = targets[name]
                    source = handle.get_tensor(name)
                    if source.shape != target.shape:
                        mismatched.append(
                            f"{name}: checkpoint {tuple(source.shape)}, model {tuple(target.shape)}"
                        )
                        continue
                    target.copy_(source)
                    loaded.update(groups.get(name, [name]))
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
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path} holds objects that safe loading refuses ({str(exc).splitlines()[0]}); nothing in it was "
            f"run. If you trust where this file came from, load it with {UNSAFE_OPT_OUT} "
            "(load_state) or weights_only=False"
        ) from exc


def parse_size(size: Any) -> int:
    """Bytes in a ``max_shard_size``: a positive int, or digits and a unit ("5MB" = 5·10⁶, "2GiB" = 2·2³⁰)."""
    return units.parse_size(size, what="max_shard_size", allow_zero=False)


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
