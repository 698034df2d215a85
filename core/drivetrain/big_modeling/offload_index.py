"""The offload folder: where weights mapped to ``"disk"`` are read from during forward.

The folder holds ``index.json``: ``{tensor name: {"safetensors_file": path, "weight_name": key,
"dtype": dtype to cast to}}``. When the checkpoint already is safetensors the entries point into the
checkpoint's own files (nothing is copied); other weights are written once as safetensors files in the
folder. Safetensors is the only on-disk format: files are memory-mapped and read lazily.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors.torch import save_file

from drivetrain.errors import CheckpointError

INDEX_FILE = "index.json"


def load_offload_index(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The index of ``folder`` (empty when it has none). Relative file paths are resolved against it. A
    damaged index is a :class:`~drivetrain.errors.CheckpointError` naming the file and the bad entry."""
    path = os.path.join(folder, INDEX_FILE)
    if not os.path.isfile(path):
        return {}
    remedy = "delete the offload folder and load the checkpoint again to rebuild it"
    try:
        with open(path) as handle:
            index = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"offload index {path} cannot be read ({type(exc).__name__}: {exc}); {remedy}"
        ) from None
    if not isinstance(index, dict):
        raise CheckpointError(f"offload index {path} is not a JSON object of weight entries; {remedy}")
    for name, entry in index.items():
        problem = _entry_problem(entry)
        if problem:
            raise CheckpointError(f"offload index {path}, entry {name!r}: {problem}; {remedy}")
        entry["safetensors_file"] = os.path.join(folder, entry["safetensors_file"])
    return index


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with one index entry, or None. Valid: {"safetensors_file": str, "weight_name": str
    (optional), "dtype": a torch dtype name (optional)}."""
    if not isinstance(entry, dict):
        return f"expected an object with 'safetensors_file', got {type(entry).__name__}"
    if not isinstance(entry.get("safetensors_file"), str) or not entry["safetensors_file"]:
        return "'safetensors_file' must be a file name"
    if "weight_name" in entry and not isinstance(entry["weight_name"], str):
        return "'weight_name' must be a string"
    dtype = entry.get("dtype")
    if dtype is not None and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
        return f"'dtype' {dtype!r} is not a torch dtype (e.g. 'float32', 'bfloat16')"
    return None


def save_offload_index(folder: str | os.PathLike, index: dict[str, dict[str, Any]]) -> None:
    """Merge ``index`` into the folder's index (files inside the folder are stored relative to it)."""
    os.makedirs(folder, exist_ok=True)
    merged = load_offload_index(folder)
    merged.update(index)
    folder_abs = os.path.abspath(folder)
    stored = {}
    for name, entry in merged.items():
        file = os.path.abspath(entry["safetensors_file"])
        if os.path.dirname(file) == folder_abs:
            file = os.path.basename(file)
        stored[name] = {**entry, "safetensors_file": file}
    temporary = os.path.join(folder, INDEX_FILE + ".tmp")
    with open(temporary, "w") as handle:
        json.dump(stored, handle, indent=1, sort_keys=True)
    os.replace(temporary, os.path.join(folder, INDEX_FILE))


def write_offloaded_weights(
    folder: str | os.PathLike, tensors: dict[str, torch.Tensor], file_name: str
) -> dict[str, dict[str, Any]]:
    """Write ``tensors`` to ``folder/file_name`` (safetensors) and return their index entries."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, file_name)
    # safetensors refuses tensors sharing memory, and needs them contiguous and on CPU.
    save_file({name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}, path)
    return {
        name: {"safetensors_file": path, "weight_name": name, "dtype": str(t.dtype).removeprefix("torch.")}
        for name, t in tensors.items()
    }
