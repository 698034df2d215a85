"""Checkpoint files: the reference format (what ``save_state``/``load_state`` fall back to), helpers to
write a backend's own files into a checkpoint, and readers that never unpickle code."""

from __future__ import annotations

from drivetrain.checkpoint.dcp_reading import read_dcp_metadata, safe_dcp_load
from drivetrain.checkpoint.manifest import checkpoint_path
from drivetrain.checkpoint.model_files import write_model_files
from drivetrain.checkpoint.serialization import safe_load
from drivetrain.checkpoint.training_objects import (
    model_file_name,
    optimizer_file_name,
    read_scheduler_state,
    read_training_objects,
    scheduler_file_name,
    torch_save_into_checkpoint,
    write_model_weights,
    write_training_objects,
    writes_shared_files,
)

__all__ = [
    # the reference format (what save_state and load_state fall back to)
    "write_training_objects",
    "read_training_objects",
    # a backend's own files in a checkpoint
    "write_model_weights",
    "torch_save_into_checkpoint",
    "writes_shared_files",
    "model_file_name",
    "optimizer_file_name",
    "scheduler_file_name",
    "write_model_files",
    # reading a checkpoint: only the files its manifest lists, scheduler states checked before they apply
    "checkpoint_path",
    "read_scheduler_state",
    # reading without unpickling code
    "safe_load",
    "safe_dcp_load",
    "read_dcp_metadata",
]
