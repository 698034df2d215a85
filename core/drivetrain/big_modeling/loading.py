"""Loading a checkpoint into a model, tensor by tensor, straight to the device each tensor belongs on.

Safetensors files go through ``drivetrain.safetensors_reader``: CPU tensors kept in the checkpoint's
dtype become views of a private (copy-on-write) mapping of the file, their pages read during the load;
the others are read into their own memory, one copy from the page cache. Either way host memory holds one
copy of the model, and tensors mapped to ``"disk"`` are not read at all: the offload index points at them
in the checkpoint. ``.bin`` files are memory-mapped by ``torch.load`` and copied tensor by tensor,
releasing the mapped pages as they go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from safetensors import safe_open

from drivetrain.big_modeling.device_map import check_device_map, device_for, normalize_device
from drivetrain.big_modeling.offload_index import save_offload_index, write_offloaded_weights
from drivetrain.big_modeling.sizes import to_dtype
from drivetrain.compat.distributions import QUANTIZATION_DISTRIBUTION
from drivetrain.constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from drivetrain.errors import CheckpointError, CheckpointMismatchError
from drivetrain.progress import track
from drivetrain.safetensors_reader import (
    DIRECT_READS_SUPPORTED,
    MADV_DONTNEED,
    MADV_WILLNEED,
    SAFETENSORS_DTYPES,
    TensorReader,
    TensorRecord,
    can_map,
    madvise,
    map_file,
    mapped_tensor,
    read_header,
)
from drivetrain.untrusted_files import link_on_the_way, outside_folder, read_json_within

logger = logging.getLogger(__name__)


class LoadResult(NamedTuple):
    """Names the checkpoint did not provide, and names it had that the model does not."""

    missing_keys: list[str]
    unexpected_keys: list[str]


# ---------------------------------------------------------------------------------------------------------
# Finding the files
# ---------------------------------------------------------------------------------------------------------


#: Largest weights index read: a genuine one takes about 100 bytes per tensor.
MAX_INDEX_BYTES = 64 * 1024 * 1024


def checkpoint_files(checkpoint: str | os.PathLike) -> list[str]:
    """The weight files of a checkpoint: a single file, an index ``.json``, or a folder holding either."""
    path = os.fspath(checkpoint)
    if os.path.isdir(path):
        for name in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
            if os.path.isfile(os.path.join(path, name)):
                return checkpoint_files(os.path.join(path, name))
        indexes = [n for n in os.listdir(path) if n.endswith(".json") and "index" in n]
        weights = [n for n in os.listdir(path) if n.endswith((".safetensors", ".bin", ".pt", ".pth"))]
        if len(indexes) == 1:
            return checkpoint_files(os.path.join(path, indexes[0]))
        if len(weights) == 1:
            return [os.path.join(path, weights[0])]
        raise CheckpointError(
            f"cannot tell which weights to load from folder {path}: expected {SAFE_WEIGHTS_INDEX_NAME}, "
            f"{WEIGHTS_INDEX_NAME}, {SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME}, one '*index*.json' or one weights "
            f"file; found {sorted(os.listdir(path))}"
        )
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.endswith(".json"):
        try:
            index = read_json_within(path, MAX_INDEX_BYTES, "checkpoint index")
        except OSError as exc:
            raise CheckpointError(f"cannot read checkpoint index {path}: {exc}") from exc
        # Transformers' format nests the map under "weight_map"; Accelerate's docs show the bare map.
        weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"checkpoint index {path} must map tensor names to file names")
        names = list(dict.fromkeys(weight_map.values()))
        outside = [name for name in names if outside_folder(name)]
        if outside:
            raise CheckpointError(
                f"checkpoint index {path} names shard(s) outside its folder: {outside[:5]}; shards are read "
                "only from the index's own folder"
            )
        folder = os.path.dirname(path)
        files = [os.path.join(folder, name) for name in names]
        linked = [name for name in names if link_on_the_way(folder, name)]
        if linked:
            raise CheckpointError(
                f"checkpoint index {path} names shard(s) reached through a symbolic link: {linked[:5]}; shards "
                "are read only from the index's own folder"
            )
        absent = [f for f in files if not os.path.isfile(f)]
        if absent:
            raise CheckpointError(f"checkpoint index {path} names shard(s) that do not exist: {absent}")
        return files
    return [path]


def is_safetensors(path: str) -> bool:
    return path.endswith(".safetensors")


@contextlib.contextmanager
def open_weights(path: str) -> Iterator[Any]:
    """Open one weights file; yields an object with ``keys()`` and ``get_tensor(name)``.

    A damaged or truncated file raises CheckpointError naming it.
    """
    try:
        if is_safetensors(path):
            handle: Any = safe_open(path, framework="pt", device="cpu")
        else:
            handle = _TorchFile(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
    except Exception as exc:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        raise CheckpointError(
            f"checkpoint file {path} ({size} bytes) is damaged or truncated and cannot be read: "
            f"{type(exc).__name__}: {exc}. Write or download it again"
        ) from exc
    yield handle


class _TorchFile:
    """A ``torch.save`` state dict behind the same interface as ``safe_open``."""

    def __init__(self, state_dict: Any) -> None:
        if not isinstance(state_dict, dict):
            raise TypeError(f"expected a state dict, found {type(state_dict).__name__}")
        self._state_dict = state_dict

    def keys(self) -> list[str]:
        return list(self._state_dict)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._state_dict[name]


# ---------------------------------------------------------------------------------------------------------
# Releasing mapped pages
# ---------------------------------------------------------------------------------------------------------


def _tensor_range(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def prefetch_pages(tensor: torch.Tensor) -> None:
    """Ask the kernel to read a memory-mapped tensor's pages ahead (one large read instead of a page fault
    per 4 KiB)."""
    if tensor.device.type == "cpu":
        madvise(*_tensor_range(tensor), MADV_WILLNEED)


def release_pages(tensor: torch.Tensor) -> None:
    """Drop the resident pages of a memory-mapped CPU tensor we are done with (they stay in the page cache,
    but no longer count in this process's memory)."""
    if tensor.device.type == "cpu":
        madvise(*_tensor_range(tensor), MADV_DONTNEED)


# ---------------------------------------------------------------------------------------------------------
# Where each tensor of the model lives
# ---------------------------------------------------------------------------------------------------------


class TensorSlots:
    """Every parameter and buffer of a model by name, with the other names a tied tensor goes by."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.canonical: dict[str, str] = {}  # any name -> first name of the same tensor
        self.places: dict[
            str, list[tuple[torch.nn.Module, str, bool]]
        ] = {}  # first name -> (owner, attr, is_param)
        first_by_id: dict[int, str] = {}
        for module_name, module in model.named_modules(remove_duplicate=False):
            for attr, tensor in [*module._parameters.items(), *module._buffers.items()]:
                if tensor is None:
                    continue
                name = f"{module_name}.{attr}" if module_name else attr
                is_param = attr in module._parameters
                first = first_by_id.setdefault(id(tensor), name)
                self.canonical[name] = first
                places = self.places.setdefault(first, [])
                if (module, attr, is_param) not in [(m, a, p) for m, a, p in places]:
                    places.append((module, attr, is_param))
        self.non_persistent = {
            f"{module_name}.{attr}" if module_name else attr
            for module_name, module in model.named_modules()
            for attr in module._non_persistent_buffers_set
        }

    def get(self, name: str) -> torch.Tensor:
        module, attr, is_param = self.places[self.canonical[name]][0]
        return (module._parameters if is_param else module._buffers)[attr]

    def names(self, first: str) -> list[str]:
        return [name for name, canonical in self.canonical.items() if canonical == first]

    def set(self, name: str, value: torch.Tensor) -> None:
        """Put ``value`` in place of the tensor ``name``, under every name it is tied to."""
        old = self.get(name)
        if isinstance(old, torch.nn.Parameter) and not isinstance(value, torch.nn.Parameter):
            new: torch.Tensor = (
                type(old)(value, requires_grad=old.requires_grad)
                if type(old) is torch.nn.Parameter
                else old.__class__(value, requires_grad=old.requires_grad, **old.__dict__)
            )
            new.__dict__.update(old.__dict__)
        else:
            new = value
        for module, attr, is_param in self.places[self.canonical[name]]:
            (module._parameters if is_param else module._buffers)[attr] = new


def _target_dtype(
    name: str,
    value: torch.Tensor,
    current: torch.Tensor,
    dtype: torch.dtype | None,
    keep_in_fp32_modules: list[str],
) -> torch.dtype:
    if not value.is_floating_point():
        return value.dtype
    parts = name.split(".")
    if any(module in parts or name.startswith(module + ".") for module in keep_in_fp32_modules):
        return torch.float32
    if dtype is not None:
        return dtype
    return current.dtype if current.is_floating_point() else value.dtype


def _to_device(device: Any) -> torch.device:
    device = normalize_device(device)
    return torch.device(f"cuda:{device}" if isinstance(device, int) else device)


# ---------------------------------------------------------------------------------------------------------
# The loader
# ---------------------------------------------------------------------------------------------------------


def load_checkpoint_in_model(
    model: torch.nn.Module,
    checkpoint: str | os.PathLike,
    device_map: dict[str, Any] | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    map_weights: bool = True,
) -> LoadResult:
    """Load the weights of ``checkpoint`` into ``model`` (which may be on the meta device).

    ``checkpoint`` is a ``.safetensors``/``.bin`` file, a sharded checkpoint's index ``.json``, or a folder
    holding one. Each tensor goes to the device ``device_map`` gives it (CPU when there is no map and the
    model is on meta). Tensors mapped to ``"disk"`` are recorded in ``offload_folder/index.json`` and left on
    the meta device; safetensors checkpoints are referenced in place, other formats are written once as
    safetensors into the folder. Floating tensors are cast to ``dtype`` (default: the model's dtype), except
    those in ``keep_in_fp32_modules``, kept in float32. ``offload_state_dict`` parks the weights going to
    the CPU on disk until the other shards are loaded (only matters for ``.bin`` shards, which are read
    whole; safetensors tensors are read straight into place). With ``strict`` a missing or unexpected
    tensor raises CheckpointError listing them. ``offload_8bit_bnb`` (bitsandbytes 8-bit weights) is not
    supported and raises NotImplementedError (quantized models load through the bnb plugin's
    ``load_and_quantize_model``).

    Every byte is read during the call. CPU tensors that keep the checkpoint's dtype are, by default
    (``map_weights=True``), views of a private copy-on-write mapping of the safetensors file: no copy, one
    set of pages shared with the page cache, and writes to a weight copy only that page. Such a model must
    not outlive a rewrite or truncation of its checkpoint files (the unmodified pages follow the file).
    ``map_weights=False`` gives every tensor its own memory instead (slower: one copy of every byte).
    """
    if offload_8bit_bnb:
        raise NotImplementedError(
            "offload_8bit_bnb=True offloads bitsandbytes 8-bit weights (Linear8bitLt) together with their "
            "SCB scale statistics, which this loader does not do; quantized models load through "
            f"load_and_quantize_model (pip install {QUANTIZATION_DISTRIBUTION}), or leave offload_8bit_bnb=False"
        )
    dtype = to_dtype(dtype)
    keep_fp32 = list(keep_in_fp32_modules or [])
    if device_map is not None:
        check_device_map(model, device_map)
        if any(normalize_device(d) == "disk" for d in device_map.values()) and offload_folder is None:
            raise ValueError(
                "the device_map puts some weights on 'disk' but no offload_folder was given; pass "
                "offload_folder='path/to/folder' (weights that are already safetensors are not copied there)"
            )
    files = checkpoint_files(checkpoint)
    slots = TensorSlots(model)
    loaded: set[str] = set()
    unexpected: list[str] = []
    disk_index: dict[str, dict[str, Any]] = {}
    deferred: list[tuple[str, str, str]] = []  # (tensor name, parked file, key) loaded at the end
    parking: tempfile.TemporaryDirectory | None = None

    def device_of(name: str) -> Any:
        if device_map is not None:
            return normalize_device(device_for(name, device_map))
        current = slots.get(name)
        return "cpu" if current.device.type == "meta" else current.device

    def check_shape(name: str, shape: tuple[int, ...], current: torch.Tensor) -> None:
        if tuple(shape) != tuple(current.shape):
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(shape)} in the checkpoint but {tuple(current.shape)} "
                "in the model"
            )

    def destination(name: str, record: TensorRecord, device: Any) -> torch.Tensor:
        """The tensor ``name``'s bytes are read into: the model's own when it already has the right device
        and dtype, else a new (still untouched) one put in the model under every tied name."""
        current = slots.get(name)
        check_shape(name, record.shape, current)
        target_dtype = _target_dtype(name, record, current, dtype, keep_fp32)
        target = _to_device(device)
        if current.device == target and current.dtype == target_dtype and current.device.type != "meta":
            return current
        out = torch.empty(record.shape, dtype=target_dtype, device=target)
        slots.set(name, out)
        return out

    def mappable(name: str, record: TensorRecord, device: Any) -> bool:
        """The tensor can be a view of the mapped file: a new CPU tensor in the checkpoint's dtype (a tensor
        the model already owns is filled in place, keeping its identity)."""
        current = slots.get(name)
        check_shape(name, record.shape, current)
        return (
            _to_device(device).type == "cpu"
            and _target_dtype(name, record, current, dtype, keep_fp32) == record.dtype
            and current.device.type == "meta"
            and can_map(record)
        )

    def place(name: str, value: torch.Tensor, device: Any) -> None:
        current = slots.get(name)
        target_dtype = _target_dtype(name, value, current, dtype, keep_fp32)
        check_shape(name, tuple(value.shape), current)
        target = _to_device(device)
        prefetch_pages(value)
        if current.device == target and current.dtype == target_dtype and current.device.type != "meta":
            with torch.no_grad():
                current.copy_(value)
        else:
            out = torch.empty(value.shape, dtype=target_dtype, device=target)
            out.copy_(value)
            slots.set(name, out)
        release_pages(value)

    def take(key: str) -> str | None:
        """The model's name for checkpoint tensor ``key``, or None when it is unknown or already loaded."""
        if key not in slots.canonical:
            unexpected.append(key)
            return None
        first = slots.canonical[key]
        if first in loaded:
            return None
        loaded.add(first)
        return first

    def index_disk(first: str, path: str, key: str, record: Any) -> None:
        target_dtype = _target_dtype(first, record, slots.get(first), dtype, keep_fp32)
        check_shape(first, record.shape, slots.get(first))
        for name in slots.names(first):
            disk_index[name] = {
                "safetensors_file": os.path.abspath(path),
                "weight_name": key,
                "dtype": str(target_dtype).removeprefix("torch."),
            }
        slots.set(first, torch.empty(record.shape, dtype=target_dtype, device="meta"))

    with TensorReader() as reader:
        previous: str | None = None
        for position, path in enumerate(track(files, "loading checkpoint files", unit="file")):
            if is_safetensors(path) and DIRECT_READS_SUPPORTED:
                records = read_header(path)
                following = files[position + 1] if position + 1 < len(files) else None
                if following is not None and is_safetensors(following):
                    reader.announce(following)
                mapping = None
                spans: list[tuple[int, int]] = []
                for key, record in records.items():
                    first = take(key)
                    if first is None:
                        continue
                    device = device_of(first)
                    if device == "disk":
                        index_disk(first, path, key, record)
                    elif map_weights and mappable(first, record, device):
                        mapping = mapping if mapping is not None else map_file(path)
                        tensor = mapped_tensor(mapping, record)
                        slots.set(first, tensor)
                        spans.append(_tensor_range(tensor))
                    else:
                        reader.read(path, record, destination(first, record, device), key)
                reader.populate(path, spans)
                # One file of lookahead: the reads of this file are queued before waiting for the last one.
                if previous is not None:
                    reader.wait(previous)
                previous = path
                continue
            to_disk: dict[str, torch.Tensor] = {}
            to_park: dict[str, torch.Tensor] = {}
            with open_weights(path) as weights:
                for key in weights.keys():
                    first = take(key)
                    if first is None:
                        continue
                    device = device_of(first)
                    if device == "disk" and is_safetensors(path):
                        index_disk(first, path, key, _slice_info(weights, key))
                        continue
                    try:
                        value = weights.get_tensor(key)
                        if device == "disk":
                            target_dtype = _target_dtype(first, value, slots.get(first), dtype, keep_fp32)
                            to_disk[first] = value.to(target_dtype)
                            slots.set(first, torch.empty(value.shape, dtype=target_dtype, device="meta"))
                        elif offload_state_dict and device == "cpu":
                            to_park[first] = value
                        else:
                            place(first, value, device)
                    except CheckpointError:
                        raise
                    except Exception as exc:
                        raise CheckpointError(
                            f"cannot read tensor {key!r} from checkpoint file {path}: "
                            f"{type(exc).__name__}: {exc}"
                        ) from exc
            if to_disk:
                stem = os.path.splitext(os.path.basename(path))[0]
                entries = write_offloaded_weights(offload_folder, to_disk, f"offload-{stem}.safetensors")  # type: ignore[arg-type]
                for first, entry in entries.items():
                    for name in slots.names(first):
                        disk_index[name] = dict(entry)
            if to_park:
                parking = parking or tempfile.TemporaryDirectory(prefix="drivetrain-parked-")
                park_file = os.path.join(parking.name, f"parked-{len(deferred)}.safetensors")
                write_offloaded_weights(parking.name, to_park, os.path.basename(park_file))
                deferred.extend((first, park_file, first) for first in to_park)
            del to_disk, to_park
        reader.wait()

    for first, path, key in deferred:
        with open_weights(path) as weights:
            place(first, weights.get_tensor(key), "cpu")
    if parking is not None:
        parking.cleanup()
    if disk_index:
        save_offload_index(offload_folder, disk_index)  # type: ignore[arg-type]

    missing = [first for first in slots.places if first not in loaded and first not in slots.non_persistent]
    if strict and (missing or unexpected):
        raise CheckpointMismatchError(
            f"checkpoint {os.fspath(checkpoint)} does not match the model (strict=True): "
            f"missing {missing or 'nothing'}; unexpected {unexpected or 'nothing'}"
        )
    if unexpected:
        logger.warning(
            "some weights of checkpoint %s were not used when loading it into %s: %s",
            os.fspath(checkpoint),
            type(model).__name__,
            unexpected,
        )
    still_empty = [name for name in missing if slots.get(name).device.type == "meta"]
    if still_empty:
        logger.warning(
            "checkpoint %s has no weights for %s; they stay on the meta device and must be set before use",
            os.fspath(checkpoint),
            still_empty,
        )
    return LoadResult(missing_keys=missing, unexpected_keys=unexpected)


class _SliceInfo(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point


def _slice_info(weights: Any, key: str) -> _SliceInfo:
    """Shape and dtype of a safetensors tensor, read from the header without touching its data (used when
    the byte reader is not available, e.g. on big-endian machines)."""
    view = weights.get_slice(key)
    dtype_name = view.get_dtype()
    dtype = SAFETENSORS_DTYPES.get(dtype_name) or getattr(torch, dtype_name.lower().replace("f8_", "float8_"))
    return _SliceInfo(tuple(view.get_shape()), dtype)
