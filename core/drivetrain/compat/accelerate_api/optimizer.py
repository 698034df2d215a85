"""Accelerate's helper functions of ``accelerate.optimizer``; ``drivetrain.optimizer`` (generated from its table
in drivetrain.compat.paths) serves them with :class:`~drivetrain.training.optimizer.AcceleratedOptimizer`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def move_to_device(state: Any, device: Any) -> Any:
    """``state`` (an optimizer state: nested lists, tuples and dicts of tensors) with every tensor on ``device``."""
    import torch

    from drivetrain.operations.nested import honor_type

    if isinstance(state, list | tuple):
        return honor_type(state, (move_to_device(item, device) for item in state))
    if isinstance(state, dict):
        return type(state)({key: move_to_device(value, device) for key, value in state.items()})
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return state


def patch_optimizer_step(accelerated_optimizer: Any, method: Callable) -> Callable:
    """``method`` (the wrapped optimizer's ``step``) recording on ``accelerated_optimizer`` that it ran, which is
    how a skipped step (fp16 overflow) is told apart."""

    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step
