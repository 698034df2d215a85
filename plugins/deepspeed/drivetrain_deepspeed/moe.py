"""Mixture-of-experts blocks as ZeRO-3 leaf modules (``DeepSpeedPlugin.transformer_moe_cls_names``)."""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError


def set_moe_leaf_modules(model: torch.nn.Module, plugin: Any) -> list[torch.nn.Module]:
    """Flag the modules of the classes named in ``plugin.transformer_moe_cls_names`` as ZeRO-3 leaf modules
    (``deepspeed.utils.set_z3_leaf_modules``) and return them.

    ZeRO-3 gathers and prefetches parameters by replaying the order in which submodules ran; a mixture of
    experts runs a different subset of experts for every batch, so the trace never holds and ranks can wait
    for each other's gathers. A leaf module gathers all its parameters at once instead. The flag is read only
    at stage 3; like Accelerate it is set at every stage (a wrong name is then caught before the run grows).
    """
    names = plugin.transformer_moe_cls_names
    if not names:
        return []
    from deepspeed.utils import set_z3_leaf_modules

    classes: dict[str, type] = {}
    for module in model.modules():
        cls = type(module)
        classes.setdefault(cls.__name__, cls)
        classes.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    missing = [name for name in names if name not in classes]
    if missing:
        present = sorted({type(module).__name__ for module in model.modules()})
        raise ConfigurationError(
            f"DeepSpeedPlugin.transformer_moe_cls_names: no module of class {', '.join(map(repr, missing))} in "
            f"the {type(model).__name__} being prepared; its module classes are: {', '.join(present)}"
        )
    return set_z3_leaf_modules(model, [classes[name] for name in names])
