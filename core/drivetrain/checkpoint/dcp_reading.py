"""Reading torch.distributed.checkpoint (DCP) folders without running code from them.

torch's own reader unpickles a DCP folder's ``.metadata`` with plain :mod:`pickle` and its default load
planner reads non-tensor values (an optimizer's step counts, learning rates ...) with
``torch.load(weights_only=False)``: a crafted folder runs any code it likes on load. Here the metadata is
read by an unpickler that knows only the classes DCP's metadata is made of (dataclasses, torch dtypes and
sizes, plain containers) and refuses every other global, so nothing in the file is called; values are read
with ``torch.load(weights_only=True)``. Tensors were already read safely by torch.

The metadata is bounded too: the file at most :data:`MAX_METADATA_BYTES`, every file it names inside the
folder, and every size it declares backed by bytes on disk, so a reader that allocates the tensors the
metadata describes (``drivetrain merge-weights``) allocates no more than the folder holds.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from typing import Any, TypeGuard

import torch

from drivetrain.errors import CheckpointError
from drivetrain.untrusted_files import outside_folder

METADATA_FILE = ".metadata"
#: Largest ``.metadata`` read: a genuine one takes about 200 bytes per stored chunk, so this is over a
#: million chunks; a larger file is refused before it is unpickled.
MAX_METADATA_BYTES = 256 * 1024 * 1024

#: (module, name) of every global a DCP ``.metadata`` may name; dtypes, layouts and memory formats of
#: torch are added in :func:`_allowed`.
_ALLOWED_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # looks a layout up by its name
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


def _allowed(module: str, name: str) -> bool:
    if (module, name) in _ALLOWED_GLOBALS:
        return True
    # torch.float32, torch.strided, torch.contiguous_format ...: constants, looked up, never called.
    return module == "torch" and isinstance(
        getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
    )


class _Refused(pickle.UnpicklingError):
    """The file names a global that DCP metadata never holds."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise _Refused(f"it names {module}.{name}, which DCP metadata never holds")
        return super().find_class(module, name)


def read_dcp_metadata(folder: str | os.PathLike) -> Any:
    """The ``Metadata`` of a DCP folder, unpickled without calling anything the file names, and checked
    (:func:`_check_metadata`): every file it names is inside the folder, and every size it declares is
    backed by bytes on disk, so allocating tensors of those sizes is bounded by the folder's size. A
    :class:`CheckpointError` naming the file when it is missing, damaged or crafted."""
    path = os.path.join(os.fspath(folder), METADATA_FILE)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_METADATA_BYTES:
                raise CheckpointError(
                    f"{path} is {size} bytes, more than the {MAX_METADATA_BYTES} any DCP checkpoint needs: "
                    "the checkpoint is damaged or was tampered with"
                )
            metadata = _MetadataUnpickler(handle).load()
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} not found: {folder} is not a torch.distributed.checkpoint folder"
        ) from None
    except _Refused as exc:
        raise CheckpointError(f"{path} was refused ({exc}); nothing in it was run") from None
    except Exception as exc:  # a truncated or garbled pickle fails in many ways
        raise CheckpointError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}): the checkpoint is damaged"
        ) from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"{path} holds a {type(metadata).__name__}, not DCP metadata: the checkpoint is damaged"
        )
    _check_metadata(os.fspath(folder), path, metadata)
    return metadata


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dims(value: Any) -> tuple[int, ...] | None:
    """``value`` as a tuple of whole numbers (a size or offset in DCP metadata), or None."""
    if not isinstance(value, (torch.Size, tuple, list)) or not all(_whole(n) for n in value):
        return None
    return tuple(value)


def _check_storage(folder: str, where: str, storage_data: Any) -> dict[str, int]:
    """Each stored item's file is a regular file inside ``folder`` (no ``..``, no absolute path, no link)
    holding the bytes the item claims; returns the size of every file named."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    if not isinstance(storage_data, dict):
        raise CheckpointError(f"{where} has no storage table: the checkpoint is damaged")
    sizes: dict[str, int] = {}
    for index, info in storage_data.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise CheckpointError(f"{where} has a storage entry of the wrong form: the checkpoint is damaged")
        relative = getattr(info, "relative_path", None)
        fqn = getattr(index, "fqn", None)
        name = os.fspath(relative) if isinstance(relative, (str, os.PathLike)) else None
        if not isinstance(name, str) or outside_folder(name):
            raise CheckpointError(
                f"{where} points {fqn!r} at {relative!r}, outside the checkpoint folder: refused"
            )
        transforms = getattr(info, "transform_descriptors", None)
        if transforms:
            raise CheckpointError(
                f"{where} stores {fqn!r} transformed ({transforms!r}): "
                "drivetrain reads only DCP checkpoints written without storage transforms, whose sizes it can "
                "check against the bytes on disk"
            )
        if name not in sizes:
            sizes[name] = _stored_file_size(folder, where, name)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (_whole(offset) and _whole(length)) or offset + length > sizes[name]:
            raise CheckpointError(
                f"{where} places {fqn!r} at bytes {offset!r}+{length!r} of {name}, which has {sizes[name]} "
                "bytes: the checkpoint is damaged"
            )
    return sizes


def _stored_file_size(folder: str, where: str, name: str) -> int:
    import stat

    path = folder
    for part in name.split("/"):
        path = os.path.join(path, part)
        try:
            status = os.lstat(path)
        except OSError:
            raise CheckpointError(f"{where} names {name}, which is missing from {folder}") from None
        if stat.S_ISLNK(status.st_mode):
            raise CheckpointError(f"{where} names {name}, a symbolic link: refused")
    if not stat.S_ISREG(status.st_mode):
        raise CheckpointError(f"{where} names {name}, which is not a regular file: refused")
    return status.st_size


def _check_metadata(folder: str, where: str, metadata: Any) -> None:
    """The bounds :func:`read_dcp_metadata` promises: files inside the folder, and each tensor's declared
    size made of chunks inside it whose stored bytes exist; all tensors together declare no more bytes
    than the files hold (which is what a reader allocating them from the metadata needs)."""
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    storage: Any = getattr(metadata, "storage_data", None)
    sizes = _check_storage(folder, where, storage)
    items = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(items, dict):
        raise CheckpointError(f"{where} has no table of saved values: the checkpoint is damaged")
    declared = 0
    for fqn, item in items.items():
        if isinstance(item, BytesStorageMetadata):
            continue
        dtype = getattr(getattr(item, "properties", None), "dtype", None)
        if not isinstance(item, TensorStorageMetadata) or not isinstance(dtype, torch.dtype):
            raise CheckpointError(
                f"{where} describes {fqn!r} in a form DCP never writes: the checkpoint is damaged"
            )
        shape, chunks = _dims(getattr(item, "size", None)), getattr(item, "chunks", None)
        if not isinstance(fqn, str) or shape is None or not isinstance(chunks, list):
            raise CheckpointError(f"{where} declares {fqn!r} with an invalid size or chunk list")
        element = dtype.itemsize
        covered = 0
        for chunk in chunks:
            if not isinstance(chunk, ChunkStorageMetadata):
                raise CheckpointError(
                    f"{where} has a chunk of {fqn!r} of the wrong form: the checkpoint is damaged"
                )
            offsets, lengths = _dims(getattr(chunk, "offsets", None)), _dims(getattr(chunk, "sizes", None))
            if (
                offsets is None
                or lengths is None
                or len(offsets) != len(shape)
                or len(lengths) != len(shape)
                or any(o + n > dim for o, n, dim in zip(offsets, lengths, shape))
            ):
                raise CheckpointError(
                    f"{where} has a chunk of {fqn!r} at {offsets!r} of size {lengths!r}, outside its declared "
                    f"size {list(shape)}: the checkpoint is damaged"
                )
            chunk_bytes = math.prod(lengths) * element
            stored = storage.get(MetadataIndex(fqn, torch.Size(offsets)))
            if chunk_bytes and (stored is None or stored.length < chunk_bytes):
                raise CheckpointError(
                    f"{where} declares {chunk_bytes} bytes for a chunk of {fqn!r} but stores "
                    f"{0 if stored is None else stored.length}: the checkpoint is damaged or was tampered with"
                )
            covered += math.prod(lengths)
        if math.prod(shape) > covered:
            raise CheckpointError(
                f"{where} declares {fqn!r} of size {list(shape)} ({math.prod(shape)} elements) but its chunks "
                f"hold {covered}: the checkpoint is damaged or was tampered with"
            )
        declared += math.prod(shape) * element
    on_disk = sum(sizes.values())
    if declared > on_disk:
        raise CheckpointError(
            f"{where} declares {declared} bytes of tensors but its files hold {on_disk}: the checkpoint is "
            "damaged or was tampered with"
        )


def _safe_reader_type() -> type:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        """torch's file reader, with :func:`read_dcp_metadata` for the metadata."""

        #: why the metadata was refused: torch swallows the error and tries per-rank files next
        refusal: CheckpointError | None = None

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if self.refusal is not None:
                raise self.refusal
            try:
                metadata = read_dcp_metadata(str(self.path))
            except CheckpointError as exc:
                self.refusal = exc
                raise
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader


def _safe_planner_type() -> type:
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._nested_dict import set_element  # noqa: F401 (same torch layout)

    class SafeLoadPlanner(DefaultLoadPlanner):
        """torch's default load planner, reading non-tensor values with ``weights_only=True``."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            from torch.distributed.checkpoint._nested_dict import set_element as set_nested

            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:
                raise CheckpointError(
                    f"value {read_item.dest_index.fqn!r} of a DCP checkpoint was refused "
                    f"({str(exc).splitlines()[0]}); nothing in it was run"
                ) from None
            if self.flatten_state_dict:
                set_nested(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeLoadPlanner


def safe_dcp_load(
    state_dict: dict[str, Any],
    checkpoint_id: str | os.PathLike,
    no_dist: bool = False,
    **planner_options: Any,
) -> None:
    """``torch.distributed.checkpoint.load(state_dict, checkpoint_id=...)`` that runs nothing from the
    folder (see the module docstring); ``planner_options`` go to torch's ``DefaultLoadPlanner``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    folder = os.fspath(checkpoint_id)
    reader = _safe_reader_type()(folder)
    planner = _safe_planner_type()(**planner_options)
    try:
        dcp.load(state_dict, storage_reader=reader, planner=planner, no_dist=no_dist)
    except CheckpointException as exc:
        # torch wraps every rank's failure in a BaseException, which ordinary error handling lets through.
        raise reader.refusal or dcp_failure(exc, f"reading {folder}") from None
    except Exception:
        if reader.refusal is not None:
            raise reader.refusal from None
        raise


def dcp_failure(exc: BaseException, what: str) -> CheckpointError:
    """A :class:`CheckpointError` for torch's ``CheckpointException`` (a ``BaseException`` carrying each
    failed rank's error): our own error as it is, else one line naming the first failed rank."""
    failures = getattr(exc, "failures", None) or {}
    for rank in sorted(failures):
        error = failures[rank][0]
        if isinstance(error, CheckpointError):
            return error
    if failures:
        rank = min(failures)
        error = failures[rank][0]
        first_line = (str(error).strip().splitlines() or [""])[0]
        return CheckpointError(f"{what} failed on rank {rank}: {type(error).__name__}: {first_line}")
    return CheckpointError(f"{what} failed: {exc}")
