"""Optimizers built before a conversion hold the parameters the conversion replaced.

TransformerEngine layers have parameters of their own, and torchao's float8 all-gather wraps each weight in
a new Parameter; an optimizer built on the model before ``prepare`` would keep stepping the old ones. The
conversion records old -> new by parameter name; ``wrap_optimizer`` points the optimizer at the new ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError


def replaced_by(
    model: torch.nn.Module, convert: Callable[[], Any]
) -> dict[torch.nn.Parameter, torch.nn.Parameter]:
    """Run ``convert()`` (which changes ``model`` in place) and return old -> new for every parameter whose
    name stayed and whose object changed."""
    before = dict(model.named_parameters())
    convert()
    after = dict(model.named_parameters())
    return {old: after[name] for name, old in before.items() if name in after and after[name] is not old}


def rebind_optimizer(
    optimizer: torch.optim.Optimizer, replaced: dict[torch.nn.Parameter, torch.nn.Parameter]
) -> None:
    """Point ``optimizer``'s param groups at the replacements, in place (its hyper-parameters stay)."""
    stale = [p for group in optimizer.param_groups for p in group["params"] if p in replaced]
    if any(optimizer.state.get(p) for p in stale):
        raise ConfigurationError(
            f"{type(optimizer).__name__} already holds state for parameters that the fp8 conversion replaced; "
            "create the optimizer before any step and pass it to prepare() with the model"
        )
    for group in optimizer.param_groups:
        params = group["params"]
        for index, parameter in enumerate(params):
            if parameter in replaced:
                params[index] = replaced[parameter]
