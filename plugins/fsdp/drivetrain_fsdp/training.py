"""The training step pieces that differ under FSDP: optimizers re-bound to sharded parameters and gradient
clipping by the norm across shards."""

from __future__ import annotations

import math
from typing import Any, cast

import torch

from drivetrain.plugin_api import ConfigurationError
from drivetrain_fsdp.bookkeeping import FLATTENED, replaced_parameters


def rebind_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Point ``optimizer``'s param groups at the sharded parameters that replaced the ones it was built on.

    The optimizer object, its hyper-parameters and its param groups stay as they are (a scheduler built on
    it keeps working). Returns whether anything changed. An optimizer that already stepped holds state
    for full, unsharded parameters, which cannot be re-bound: that is an error.
    """
    changed = False
    stale = [p for group in optimizer.param_groups for p in group["params"] if p in replaced_parameters]
    with_state = [p for p in stale if optimizer.state.get(p)]
    if with_state:
        raise ConfigurationError(
            f"{type(optimizer).__name__} already holds state (it stepped before prepare) for {len(with_state)} "
            "parameter(s) that the fsdp backend replaced by sharded ones; that state cannot be re-bound. Create "
            "the optimizer before any step and pass it to prepare() with the model, or create it after "
            "prepare(model) from model.parameters()"
        )
    if any(
        replaced_parameters.get(p) is FLATTENED for group in optimizer.param_groups for p in group["params"]
    ):
        raise ConfigurationError(
            f"{type(optimizer).__name__} was built on the model's parameters before prepare, but FSDP1 with "
            "use_orig_params=False flattens them: create the optimizer after prepare(model) from "
            "model.parameters(), or set use_orig_params=True"
        )
    for group in optimizer.param_groups:
        params = group["params"]
        for index, parameter in enumerate(params):
            replacement = replaced_parameters.get(parameter)
            if replacement is not None:
                # In place: optimizers such as LBFGS keep a reference to this very list.
                params[index] = replacement
                optimizer.state.pop(parameter, None)
                changed = True
    return changed


def _is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor | None:
    """Clip by the norm of all gradients across every shard; None when no gradient is sharded (then the
    reference backend's clipping is already global)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not any(_is_dtensor(grad) for grad in grads):
        return None
    norm_type = float(norm_type)
    groups: dict[Any, list[torch.Tensor]] = {}
    for grad in grads:
        key = cast(Any, grad).device_mesh if _is_dtensor(grad) else None
        groups.setdefault(key, []).append(grad)
    norms = []
    for key, members in groups.items():
        norm = torch.nn.utils.get_total_norm(members, norm_type)
        norms.append(cast(Any, norm).full_tensor() if key is not None else norm)
    stacked = torch.stack([norm.to(norms[0].device, torch.float32) for norm in norms])
    total = stacked.max() if math.isinf(norm_type) else stacked.pow(norm_type).sum().pow(1.0 / norm_type)
    coefficient = float(max_norm) / (float(total) + 1e-6)
    if coefficient < 1.0:
        with torch.no_grad():
            for grad in grads:
                grad.mul_(coefficient)
    return total
