"""The process-wide state objects, as Accelerate names them, and the generators the kernel seeds and
checkpoints. Hooks receive the Accelerator (``accelerator.state``, ``accelerator.gradient_state``); these are
for code that runs outside a hook (a wrapper's method, a device plugin's setup)."""

from __future__ import annotations

from drivetrain.operations.random import register_rng_type
from drivetrain.state import AcceleratorState, PartialState, initialized_accelerator_state, reset_state

__all__ = [
    "AcceleratorState",
    "PartialState",
    "initialized_accelerator_state",
    "reset_state",
    "register_rng_type",
]
