"""``save_model``'s on-disk form: one weights file, or shards plus an index, under the names transformers
and safetensors look for (``model.safetensors`` or ``model-00001-of-00003.safetensors`` +
``model.safetensors.index.json``; the ``pytorch_model`` names when not safe)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch

from drivetrain.checkpoint.files import atomic_write
from drivetrain.checkpoint.serialization import deduplicate_shared, plan_shards, save_safetensors_atomically
from drivetrain.constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from drivetrain.progress import track
from drivetrain.units import parse_size


def _shard_name(base: str, index: int, count: int) -> str:
    stem, extension = base.rsplit(".", 1)
    return f"{stem}-{index + 1:05d}-of-{count:05d}.{extension}"


def _stale_weight_files(directory: str, base: str, keep: set[str]) -> list[str]:
    """Files a previous save of ``base`` left that this save does not rewrite (another shard count)."""
    stem, extension = base.rsplit(".", 1)
    pattern = re.compile(rf"^{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?\.{re.escape(extension)}$")
    return [name for name in os.listdir(directory) if pattern.match(name) and name not in keep]


def write_model_files(
    state_dict: dict[str, torch.Tensor],
    directory: str,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> list[str]:
    """Write ``state_dict`` into ``directory`` as one file or as shards with an index; returns the weight
    files written. Each file is replaced atomically; the index is written after its shards."""
    limit = parse_size(max_shard_size, what="max_shard_size", allow_zero=False)
    if os.path.isfile(directory):
        raise ValueError(f"save_directory {directory} is a file; save_model needs a directory")
    os.makedirs(directory, exist_ok=True)
    if safe_serialization:
        tensors, _aliases = deduplicate_shared(state_dict)
        base, index_name = SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME
    else:
        tensors = dict(state_dict)
        base, index_name = WEIGHTS_NAME, WEIGHTS_INDEX_NAME
    shards = plan_shards(tensors, limit)
    names = [base] if len(shards) == 1 else [_shard_name(base, i, len(shards)) for i in range(len(shards))]
    for name, keys in track(list(zip(names, shards)), "writing model weights", unit="file"):
        shard = {key: tensors[key] for key in keys}
        path = os.path.join(directory, name)
        if safe_serialization:
            save_safetensors_atomically(shard, path)
        else:
            atomic_write(
                path, lambda out, shard=shard: torch.save({k: v.cpu() for k, v in shard.items()}, out)
            )
    index_path = os.path.join(directory, index_name)
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index: dict[str, Any] = {
            "metadata": {"total_size": total},
            "weight_map": {key: name for name, keys in zip(names, shards) for key in keys},
        }
        atomic_write(index_path, lambda out: out.write(json.dumps(index, indent=2, sort_keys=True).encode()))
    elif os.path.exists(index_path):
        os.remove(index_path)
    for stale in _stale_weight_files(directory, base, set(names)):
        os.remove(os.path.join(directory, stale))
    return names
