"""The reference backward pass, shared by the reference backend and by backends that add a step after it."""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.contract.arguments import PluginAccelerator


def reference_backward(
    loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]
) -> None:
    """What the reference backend's ``backward`` does: scale ``loss`` by ``accelerator.scaler`` when there is
    one (fp16), then ``loss.backward(**backward_kwargs)``. ``loss`` arrives already divided by the gradient
    accumulation steps.

    A backend whose ``backward`` hook adds its own step calls this, then does that step (a gradient
    all-reduce when ``accelerator.sync_gradients``: gradients must be synchronised by the end of the
    synchronised backward, because clipping reads them next), then returns True.
    """
    scaler = accelerator.scaler
    if scaler is not None:
        loss = scaler.scale(loss)
    loss.backward(**backward_kwargs)
