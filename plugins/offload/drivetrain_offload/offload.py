"""The user-facing offload functions: whole models offloaded to CPU RAM or disk, and model chains."""

from __future__ import annotations

import os
from typing import Any

import torch

from drivetrain.plugin_api.big_model import (
    INDEX_FILE,
    find_tied_parameters,
    save_offload_index,
    write_offloaded_weights,
)
from drivetrain_offload.attach import attach_align_device_hook
from drivetrain_offload.module_hooks import (
    AlignDevicesHook,
    CpuOffloadHook,
    UserCpuOffloadHook,
    add_hook_to_module,
)
from drivetrain_offload.prefetch import Prefetcher
from drivetrain_offload.weights import OffloadedWeights, build_tied_params_map


def as_device(device: Any) -> torch.device:
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def default_execution_device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _attach_offload(
    model: torch.nn.Module,
    execution_device: Any,
    weights: OffloadedWeights,
    offload_buffers: bool,
    preload_module_classes: list[str] | None,
    prefetch: bool,
) -> torch.nn.Module:
    tied = [name for group in find_tied_parameters(model) for name in group]
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    hooks = attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        weights_map=weights,
        offload_buffers=offload_buffers,
        preload_module_classes=preload_module_classes,
        tied_params_map=build_tied_params_map(model, weights, tied),
    )
    if prefetch and len(hooks) > 1:
        prefetcher = Prefetcher(hooks)
        for hook in hooks:
            hook.prefetcher = prefetcher
        setattr(model, "_drivetrain_prefetcher", prefetcher)  # noqa: B010 (an attribute torch's type lacks)
    return model


def cpu_offload(
    model: torch.nn.Module,
    execution_device: torch.device | str | int | None = None,
    offload_buffers: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
    prefetch: bool = True,
) -> torch.nn.Module:
    """Keep one copy of the weights in CPU RAM; each module's weights visit ``execution_device`` (default
    the first GPU, else the CPU) only while it runs. Outputs return to the inputs' device."""
    execution_device = execution_device if execution_device is not None else default_execution_device()
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict(keep_vars=True).items()}
        state_dict = {name: tensor.detach() for name, tensor in state_dict.items()}
    if as_device(execution_device).type == "cuda":  # pinned pages make host-to-device copies asynchronous
        state_dict = {name: tensor.pin_memory() for name, tensor in state_dict.items()}
    weights = OffloadedWeights(in_memory=state_dict)
    return _attach_offload(
        model, execution_device, weights, offload_buffers, preload_module_classes, prefetch
    )


def disk_offload(
    model: torch.nn.Module,
    offload_dir: str | os.PathLike,
    execution_device: torch.device | str | int | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
    prefetch: bool = True,
) -> torch.nn.Module:
    """Keep the weights in memory-mapped safetensors files in ``offload_dir``; each module reads its
    weights to ``execution_device`` only while it runs. A folder that already has an ``index.json`` (for
    example written by ``load_checkpoint_in_model``) is used as it is."""
    execution_device = execution_device if execution_device is not None else default_execution_device()
    folder = os.fspath(offload_dir)
    if not os.path.isfile(os.path.join(folder, INDEX_FILE)):
        write_model_to_folder(model, folder)
    weights = OffloadedWeights(folder=folder)
    return _attach_offload(
        model, execution_device, weights, offload_buffers, preload_module_classes, prefetch
    )


def write_model_to_folder(model: torch.nn.Module, folder: str, names: list[str] | None = None) -> None:
    """Write the model's tensors (or only ``names``) to ``folder`` as safetensors, tied tensors once."""
    state = model.state_dict(keep_vars=True)
    first_by_id: dict[int, str] = {}
    unique: dict[str, torch.Tensor] = {}
    alias: dict[str, str] = {}
    for name, tensor in state.items():
        if names is not None and name not in names:
            continue
        first = first_by_id.setdefault(id(tensor), name)
        alias[name] = first
        if first == name:
            unique[name] = tensor.detach()
    entries = write_offloaded_weights(
        folder, unique, f"weights-{len(os.listdir(folder)) if os.path.isdir(folder) else 0}.safetensors"
    )
    save_offload_index(folder, {name: entries[first] for name, first in alias.items()})


def cpu_offload_with_hook(
    model: torch.nn.Module,
    execution_device: torch.device | str | int | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[torch.nn.Module, UserCpuOffloadHook]:
    """Move the whole model to ``execution_device`` at its first forward and keep it there until
    ``hook.offload()`` is called, or until the next model of a chain (``prev_module_hook``) runs. Faster
    than :func:`cpu_offload` for models called in a loop, at the cost of holding one model on the device."""
    hook = CpuOffloadHook(
        execution_device if execution_device is not None else default_execution_device(), prev_module_hook
    )
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)
