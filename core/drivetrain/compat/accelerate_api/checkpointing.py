"""Accelerate's custom-state functions of ``accelerate.checkpointing``: the file layout of an object registered
with ``register_for_checkpointing``, for scripts that call them directly. ``drivetrain.checkpointing`` (generated
from its table in drivetrain.compat.paths) serves them with drivetrain's checkpoint names (drivetrain.checkpoint)."""

from __future__ import annotations

import os
from typing import Any

from drivetrain.checkpoint.checkpointer import save


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
