"""Microsoft MS-AMP: ``msamp.initialize`` converts a model and its optimizer together.

O1 keeps weights in fp8/fp16 and communicates weight gradients in fp8; O2 also keeps the optimizer states in
fp8/fp16. MS-AMP's own recipe trains with a GradScaler (as Accelerate does for it, bf16 autocast or not), so
this plugin scales the loss in ``backward``, unscales before clipping and steps through the scaler.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError


def initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, opt_level: str) -> tuple[Any, Any]:
    """MS-AMP's model and optimizer for ``opt_level`` ("O1" or "O2")."""
    import msamp

    return msamp.initialize(model, optimizer, opt_level=opt_level)


def the_optimizer_of(pending: list[Any], evaluation_mode: bool) -> torch.optim.Optimizer:
    """The one optimizer prepared together with the model, or a one-line error saying how to pass it."""
    if evaluation_mode or not pending:
        raise ConfigurationError(
            "fp8 backend msamp converts a model and its optimizer together: pass both to one "
            "accelerator.prepare(model, optimizer) call"
        )
    if len(pending) > 1:
        raise ConfigurationError(
            f"fp8 backend msamp converts one model with one optimizer; this prepare() call holds {len(pending)} "
            "optimizers"
        )
    return pending[0]
