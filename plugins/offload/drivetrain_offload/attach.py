"""Attaching module hooks to a model: one per module that holds tensors, plus one per device-map entry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from drivetrain_offload.module_hooks import AlignDevicesHook, add_hook_to_module
from drivetrain_offload.prefetch import Prefetcher
from drivetrain_offload.weights import PrefixedWeights


def _has_direct_tensors(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(
        True for _ in module.buffers(recurse=False)
    )


def attach_execution_device_hook(
    module: torch.nn.Module,
    execution_device: torch.device | str | int,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Give every submodule that holds tensors a module hook moving its inputs to ``execution_device``
    (tied weights found in ``tied_params_map`` are moved once)."""
    if not hasattr(module, "_hf_hook") and _has_direct_tensors(module):
        add_hook_to_module(
            module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map)
        )
    if preload_module_classes and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(
            child, execution_device, skip_keys, preload_module_classes, tied_params_map
        )


def attach_align_device_hook(
    module: torch.nn.Module,
    execution_device: torch.device | str | int | None = None,
    offload: bool = False,
    weights_map: Mapping | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
) -> list[AlignDevicesHook]:
    """Give every submodule that holds tensors an :class:`AlignDevicesHook`; with ``offload`` its weights
    come from ``weights_map`` (full names under ``module_name``) at each forward. Modules of
    ``preload_module_classes`` get one hook for their whole subtree. Returns the hooks, in module order."""
    hooks: list[AlignDevicesHook] = []
    preload = preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if _has_direct_tensors(module) or preload:
        prefix = f"{module_name}." if module_name else ""
        hook = AlignDevicesHook(
            execution_device,
            offload=offload,
            weights_map=PrefixedWeights(weights_map, prefix) if offload and weights_map is not None else None,
            offload_buffers=offload_buffers,
            place_submodules=preload,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
        hooks.append(hook)
    if preload:
        return hooks
    for name, child in module.named_children():
        child_name = f"{module_name}.{name}" if module_name else name
        hooks += attach_align_device_hook(
            child,
            execution_device,
            offload,
            weights_map,
            offload_buffers,
            child_name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )
    return hooks


def attach_align_device_hook_on_blocks(
    module: torch.nn.Module,
    execution_device: torch.device | str | int | dict[str, Any] | None = None,
    offload: bool | dict[str, bool] = False,
    weights_map: Mapping | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
    prefetch: bool = False,
) -> list[AlignDevicesHook]:
    """Attach hooks block by block: ``execution_device`` and ``offload`` map block names to their device
    and to whether their weights are offloaded. Each block moves its inputs to its device; offloaded blocks
    bring their weights in at forward. With ``prefetch`` the next offloaded module's weights are loaded
    while the current one runs. ``tied_params_map`` (see :class:`AlignDevicesHook`) keeps a tied weight
    from being brought to a device twice. Returns the offloading hooks, in module order."""
    if not isinstance(execution_device, Mapping):
        execution_device = {module_name: execution_device}
    if not isinstance(offload, Mapping):
        offload = {name: bool(offload) for name in execution_device}
    offloading: list[AlignDevicesHook] = []
    named = dict(module.named_modules())
    order = {name: index for index, name in enumerate(named)}
    blocks = sorted(execution_device, key=lambda name: order.get(name, len(order)))
    for block in blocks:
        full = block if not module_name else (f"{module_name}.{block}" if block else module_name)
        relative = block
        target = named.get(relative)
        if target is None:
            continue  # a tensor name: handled with its parent module below
        device = execution_device[block]
        if offload.get(block, False):
            offloading += attach_align_device_hook(
                target,
                device,
                True,
                weights_map,
                offload_buffers,
                full,
                skip_keys,
                preload_module_classes,
                tied_params_map,
            )
        else:
            for child in target.modules():
                if not hasattr(child, "_hf_hook") and _has_direct_tensors(child):
                    add_hook_to_module(
                        child, AlignDevicesHook(device, skip_keys=skip_keys, tied_params_map=tied_params_map)
                    )
        # The block moves its own inputs (residual connections need them on the block's device); a
        # container without forward passes that job to its children.
        for entry in _entry_points(target):
            add_hook_to_module(entry, AlignDevicesHook(device, skip_keys=skip_keys), append=True)
    # Tensors named directly in the map (a module split between devices): the owner gets one hook that
    # moves its inputs and offloads just the tensors mapped to an offload device.
    owners: dict[str, list[str]] = {}
    for name in execution_device:
        if name not in named:
            owners.setdefault(name.rpartition(".")[0], []).append(name)
    for owner_name, names in owners.items():
        owner = named.get(owner_name)
        if owner is None:
            continue
        offloaded_names = [name.rpartition(".")[2] for name in names if offload.get(name, False)]
        hook = AlignDevicesHook(
            execution_device[names[0]],
            offload=bool(offloaded_names),
            weights_map=PrefixedWeights(weights_map, f"{owner_name}." if owner_name else "")
            if offloaded_names and weights_map is not None
            else None,
            offload_buffers=offload_buffers,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        hook.managed = offloaded_names
        add_hook_to_module(owner, hook, append=True)
        if hook.offload:
            offloading.append(hook)
    if prefetch and len(offloading) > 1:
        prefetcher = Prefetcher(offloading)
        for hook in offloading:
            hook.prefetcher = prefetcher
        setattr(module, "_drivetrain_prefetcher", prefetcher)  # noqa: B010 (an attribute torch's type lacks)
    return offloading


def _entry_points(module: torch.nn.Module) -> list[torch.nn.Module]:
    if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
        return [entry for child in module.children() for entry in _entry_points(child)]
    return [module]
