"""Reading torch.distributed.checkpoint (DCP) folders without running code from them.

torch's own reader unpickles a DCP folder's ``.metadata`` with plain :mod:`pickle` and its default load
planner reads non-tensor values (an optimizer's step counts, learning rates ...) with
``torch.load(weights_only=False)``: a crafted folder runs any code it likes on load. Here the metadata is
read by an unpickler that knows only the classes DCP's metadata is made of (dataclasses, torch dtypes and
sizes, plain containers) and refuses every other global, so nothing in the file is called; values are read
with ``torch.load(weights_only=True)``. Tensors were already read safely by torch.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch

from drivetrain.errors import CheckpointError

METADATA_FILE = ".metadata"

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
    """The ``Metadata`` of a DCP folder, unpickled without calling anything the file names; a
    :class:`CheckpointError` naming the file when it is missing, damaged or crafted."""
    path = os.path.join(os.fspath(folder), METADATA_FILE)
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
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
    return metadata


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
