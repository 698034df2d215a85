"""Which modules become FSDP units (the auto wrap policy) and which are left out of sharding."""

from __future__ import annotations

import re
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError
from drivetrain_fsdp.enums import AutoWrapPolicy


# -- which modules become FSDP units ------------------------------------------------------------------------
def ignored_modules(model: torch.nn.Module, config: Any) -> list[torch.nn.Module]:
    if config.ignored_modules is None:
        return []
    if isinstance(config.ignored_modules, str):
        pattern = re.compile(config.ignored_modules)
        return [module for name, module in model.named_modules() if name and pattern.fullmatch(name)]
    owned = {id(module) for module in model.modules()}
    return [module for module in config.ignored_modules if id(module) in owned]


def get_parameters_from_modules(modules: Any, model: torch.nn.Module, device: Any) -> set[torch.nn.Parameter]:
    """Accelerate's ``accelerate.utils.fsdp_utils.get_parameters_from_modules`` (trl calls it to prepare a model
    under FSDP2): the parameters of ``modules``, a list of modules or a regular expression over the model's
    module names (full match). As in Accelerate, modules found by name are moved to ``device`` (they are
    left out of sharding, so they must already sit where they run); a given list is not moved."""
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        found = [module for name, module in model.named_modules() if pattern.fullmatch(name)]
        for module in found:
            module.to(device)
        modules = found
    return {parameter for module in modules for parameter in module.parameters()}


def _bottom_up(model: torch.nn.Module, skip: set[int]) -> list[tuple[str, torch.nn.Module]]:
    """Submodules (not the root), children before parents, leaving out ``skip`` and their descendants."""
    ordered = []
    skipped_prefixes: list[str] = []
    for name, module in model.named_modules():
        if not name:
            continue
        if any(name.startswith(prefix) for prefix in skipped_prefixes):
            continue
        if id(module) in skip:
            skipped_prefixes.append(name + ".")
            continue
        ordered.append((name, module))
    return ordered[::-1]


def modules_to_wrap(
    model: torch.nn.Module, config: Any, ignored: list[torch.nn.Module]
) -> list[torch.nn.Module]:
    """The submodules that become FSDP units of their own, children before parents (the root is always one)."""
    policy = config.resolved_auto_wrap_policy(model)
    candidates = _bottom_up(model, {id(module) for module in ignored})
    if policy == AutoWrapPolicy.NO_WRAP:
        return []
    if policy == AutoWrapPolicy.TRANSFORMER_BASED_WRAP:
        names = set(config.transformer_cls_names_to_wrap or getattr(model, "_no_split_modules", None) or [])
        present = {type(module).__name__ for module in model.modules()}
        missing = sorted(names - present)
        if missing:
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.transformer_cls_names_to_wrap: no module of class "
                f"{', '.join(missing)} in the model {type(model).__name__}; classes present: "
                f"{', '.join(sorted(present))}"
            )
        return [module for _, module in candidates if type(module).__name__ in names]
    if policy == AutoWrapPolicy.SIZE_BASED_WRAP:
        wrapped: list[torch.nn.Module] = []
        counted: set[int] = set()  # parameters already inside a chosen unit
        for _, module in candidates:
            own = [p for p in module.parameters() if id(p) not in counted]
            if sum(p.numel() for p in own) >= config.min_num_params:
                wrapped.append(module)
                counted.update(id(p) for p in own)
        return wrapped
    return [module for _, module in candidates if policy(module)]
