"""``merge_fsdp_weights`` and ``drivetrain merge-weights``: a SHARDED checkpoint's model shards joined into
one model file (``model.safetensors``, or shards with an index when larger than ``max_shard_size``).

Runs in one process without a process group: torch.distributed.checkpoint reads every rank's shard.
"""

from __future__ import annotations

import argparse
import os
import shutil
import warnings
from typing import Any

import torch

from drivetrain.plugin_api import CheckpointError
from drivetrain.plugin_api.checkpoint import read_dcp_metadata, safe_dcp_load

METADATA_FILE = ".metadata"


def _model_checkpoint_folder(checkpoint_dir: str) -> str:
    """``checkpoint_dir`` itself when it is a DCP folder, else its first model's ``pytorch_model_fsdp_0``."""
    from drivetrain_fsdp.checkpoint import MODEL_FOLDER

    if os.path.isfile(os.path.join(checkpoint_dir, METADATA_FILE)):
        return checkpoint_dir
    inner = os.path.join(checkpoint_dir, f"{MODEL_FOLDER}_0")
    if os.path.isfile(os.path.join(inner, METADATA_FILE)):
        return inner
    raise CheckpointError(
        f"{checkpoint_dir} is not a sharded FSDP checkpoint: it has no {METADATA_FILE} file (nor a "
        f"{MODEL_FOLDER}_0/ folder with one). Pass the folder save_state wrote with "
        "state_dict_type=SHARDED_STATE_DICT, or its pytorch_model_fsdp_<i> subfolder"
    )


def load_sharded_model_state(checkpoint_dir: str) -> dict[str, torch.Tensor]:
    """The full model state dict held by a sharded checkpoint folder, in CPU memory."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from drivetrain_fsdp.checkpoint import MODEL_KEY

    folder = _model_checkpoint_folder(checkpoint_dir)
    metadata = read_dcp_metadata(folder)
    prefix = f"{MODEL_KEY}."
    state: dict[str, Any] = {}
    for key, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            state[key] = torch.empty(item.size, dtype=item.properties.dtype)
    if not state:
        raise CheckpointError(f"{folder} holds no tensors")
    with warnings.catch_warnings():
        # One process reading every shard on purpose; torch warns that no process group is initialised.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        safe_dcp_load(state, folder, no_dist=True)
    return {key[len(prefix) :] if key.startswith(prefix) else key: tensor for key, tensor in state.items()}


def merge_fsdp_weights(
    checkpoint_dir: str,
    output_path: str,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
    max_shard_size: int | str = "10GB",
) -> list[str]:
    """Merge the model shards of a SHARDED checkpoint into ``output_path`` (``model.safetensors``, or
    ``pytorch_model.bin`` without ``safe_serialization``); returns the files written.

    :param checkpoint_dir: a ``pytorch_model_fsdp_<i>`` folder, or the checkpoint folder holding
        ``pytorch_model_fsdp_0``.
    :param remove_checkpoint_dir: delete ``checkpoint_dir`` once the merged model is written.

    Called by every process of a distributed run, only the main process merges (the others return an empty
    list) and all return once the files are written.
    """
    from drivetrain.plugin_api.checkpoint import write_model_files

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    written: list[str] = []
    if not distributed or torch.distributed.get_rank() == 0:
        checkpoint_dir, output_path = os.fspath(checkpoint_dir), os.fspath(output_path)
        state = load_sharded_model_state(checkpoint_dir)
        written = write_model_files(state, output_path, max_shard_size, safe_serialization)
        if remove_checkpoint_dir:
            shutil.rmtree(checkpoint_dir)
    if distributed:
        torch.distributed.barrier()
    return written


# -- the CLI command ---------------------------------------------------------------------------------------------
def register_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint_directory", help="a sharded checkpoint (or its pytorch_model_fsdp_<i> folder)"
    )
    parser.add_argument("output_path", help="folder to write the merged model into")
    parser.add_argument(
        "--unsafe_serialization",
        action="store_true",
        help="write pytorch_model.bin (pickle) instead of model.safetensors",
    )
    parser.add_argument(
        "--remove_checkpoint_dir",
        action="store_true",
        help="delete the sharded checkpoint folder after merging",
    )
    parser.add_argument("--max_shard_size", default="10GB", help="largest output file (default 10GB)")


def run(args: argparse.Namespace) -> int:
    written = merge_fsdp_weights(
        args.checkpoint_directory,
        args.output_path,
        safe_serialization=not args.unsafe_serialization,
        remove_checkpoint_dir=args.remove_checkpoint_dir,
        max_shard_size=args.max_shard_size,
    )
    for path in written:
        print(f"wrote {path}")
    return 0
