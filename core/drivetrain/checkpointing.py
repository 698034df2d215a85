"""Checkpointing: ``Accelerator.save_state`` / ``load_state`` / ``save_model`` and the functions behind them.

The code lives in :mod:`drivetrain.checkpoint` (the Accelerator's checkpoints are a
:class:`~drivetrain.checkpoint.checkpointer.Checkpointer`); this module is Accelerate's import path for the
names scripts use. See docs/checkpointing.md.
"""

from __future__ import annotations

import os
from typing import Any

from drivetrain.checkpoint.checkpointer import (
    CHECKPOINTS_FOLDER,
    Checkpointer,
    clean_state_dict_for_safetensors,
    save,
)
from drivetrain.checkpoint.files import atomic_write, sha256_of_file
from drivetrain.checkpoint.manifest import MANIFEST_NAME, is_complete, read_manifest, verify
from drivetrain.checkpoint.model_files import write_model_files
from drivetrain.checkpoint.rotation import complete_checkpoints
from drivetrain.checkpoint.serialization import (
    UNSAFE_OPT_OUT,
    deduplicate_shared,
    load_safetensors_into_module,
    safe_load,
    save_safetensors,
)
from drivetrain.checkpoint.training_objects import (
    read_training_objects,
    write_model_weights,
    write_training_objects,
)

#: Accelerate's name for verifying a checkpoint folder (kept for scripts that call it).
verify_checkpoint = verify

__all__ = [
    "CHECKPOINTS_FOLDER",
    "MANIFEST_NAME",
    "UNSAFE_OPT_OUT",
    "Checkpointer",
    "atomic_write",
    "clean_state_dict_for_safetensors",
    "complete_checkpoints",
    "deduplicate_shared",
    "is_complete",
    "load_safetensors_into_module",
    "read_manifest",
    "read_training_objects",
    "safe_load",
    "save",
    "save_safetensors",
    "sha256_of_file",
    "verify",
    "verify_checkpoint",
    "write_model_files",
    "write_model_weights",
    "write_training_objects",
]


def save_custom_state(
    obj: Any, path: str | os.PathLike, index: int = 0, save_on_each_node: bool = False
) -> None:
    """Write ``obj.state_dict()`` to ``path/custom_checkpoint_<index>.pkl`` (Accelerate's layout and name)."""
    save(
        obj.state_dict(),
        os.path.join(path, f"custom_checkpoint_{index}.pkl"),
        save_on_each_node=save_on_each_node,
    )


def load_custom_state(obj: Any, path: str | os.PathLike, index: int = 0) -> None:
    """Load what :func:`save_custom_state` wrote into ``obj`` (``obj.load_state_dict``)."""
    import torch

    location = os.path.join(path, f"custom_checkpoint_{index}.pkl")
    obj.load_state_dict(torch.load(location, map_location="cpu", weights_only=False))


__all__ += ["load_custom_state", "save_custom_state"]


def __getattr__(name: str) -> Any:
    # Accelerate's module logger, made when asked for
    if name == "logger":
        from drivetrain.logging import get_logger

        return get_logger(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
