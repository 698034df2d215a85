"""The ``dispatch_module`` plugin hook: honour a device map that spans devices or offloads weights."""

from __future__ import annotations

import os
from typing import Any

import torch

from drivetrain.plugin_api.big_model import device_for, find_tied_parameters, normalize_device
from drivetrain_offload.attach import attach_align_device_hook_on_blocks
from drivetrain_offload.module_hooks import AlignDevicesHook, add_hook_to_module
from drivetrain_offload.offload import as_device, write_model_to_folder
from drivetrain_offload.weights import OffloadedWeights, build_tied_params_map


def dispatch(
    model: torch.nn.Module,
    device_map: dict[str, Any],
    main_device: Any,
    offload_dir: str | None,
    state_dict: dict[str, Any] | None,
    options: dict[str, Any],
) -> torch.nn.Module:
    main = as_device(normalize_device(main_device))
    offload_buffers = bool(options.get("offload_buffers"))
    skip_keys = options.get("skip_keys")
    execution: dict[str, torch.device] = {}
    offloaded: dict[str, bool] = {}
    for name, device in device_map.items():
        device = normalize_device(device)
        offloaded[name] = device == "disk" or (device == "cpu" and main.type != "cpu")
        execution[name] = main if offloaded[name] else as_device(device)

    devices = {normalize_device(device) for device in device_map.values()}
    weights = OffloadedWeights(in_memory=state_dict, index=options.get("offload_index"), folder=offload_dir)
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    groups = {name: group for group in find_tied_parameters(model) for name in group}
    to_write: list[str] = []
    for name, tensor in tensors.items():
        entry = device_for(name, device_map)
        device = normalize_device(device_map[entry]) if entry in device_map else None
        is_buffer = name not in dict(model.named_parameters(remove_duplicate=False))
        if not offloaded.get(_entry_name(name, device_map), False) or (is_buffer and not offload_buffers):
            if tensor.device.type == "meta":
                if is_buffer and not offload_buffers and name in weights:
                    tensor = weights[name]
                    _set_data(model, name, tensor.to(execution[_entry_name(name, device_map)]))
                    continue
                raise ValueError(
                    f"tensor {name!r} is on the meta device but the device map puts it on {device!r}: load its "
                    "weights first (load_checkpoint_in_model) or pass them in state_dict"
                )
            _set_data(model, name, tensor.data.to(execution[_entry_name(name, device_map)]))
            continue
        if name in weights:
            continue
        twin = next((other for other in groups.get(name, []) if other in weights), None)
        if twin is not None:
            if twin in weights.in_memory:
                weights.in_memory[name] = weights.in_memory[twin]
            else:
                weights.index[name] = weights.index[twin]
            continue
        if tensor.device.type == "meta":
            raise ValueError(
                f"tensor {name!r} is offloaded to {device!r} but is on the meta device and not in state_dict or "
                f"the offload folder {offload_dir!r}; load the checkpoint with offload_folder={offload_dir!r}"
            )
        if device == "disk":
            to_write.append(name)
        else:
            tensor = tensor.detach().to("cpu")
            weights.in_memory[name] = tensor.pin_memory() if main.type == "cuda" else tensor
    if to_write:
        if offload_dir is None:
            raise ValueError("the device map offloads to 'disk' but no offload_dir was given")
        write_model_to_folder(model, offload_dir, names=to_write)
        weights.index.update(OffloadedWeights(folder=offload_dir).index)

    add_hook_to_module(model, AlignDevicesHook(io_same_device=True, skip_keys=skip_keys), append=True)
    attach_align_device_hook_on_blocks(
        model,
        execution_device=execution,
        offload=offloaded,
        weights_map=weights,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=options.get("preload_module_classes"),
        tied_params_map=build_tied_params_map(
            model, weights, [name for group in groups.values() for name in group]
        ),
        prefetch=_should_prefetch(options.get("prefetch"), main, "disk" in devices),
    )
    return model


def _should_prefetch(asked: bool | None, main: torch.device, disk: bool) -> bool:
    """Prefetch the next offloaded block when asked, and by default when computing on an accelerator or
    when weights are on disk: reading the next block's pages on a worker thread overlaps disk reads with
    compute (bench/big_model_load.py, 2 GiB, 2 cores: cold-cache forward 0.78 s with, 1.18 s without; warm
    0.43 s both), for one block of extra memory. Weights offloaded to CPU RAM and run on the CPU are used
    in place; there is nothing to prefetch."""
    if asked is not None:
        return bool(asked)
    return main.type != "cpu" or disk


def _entry_name(name: str, device_map: dict[str, Any]) -> str:
    candidate = name
    while candidate not in device_map:
        candidate = candidate.rpartition(".")[0]
    return candidate


def _set_data(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Move a tensor in place (``.data``), so that tied parameters stay one object."""
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    param = owner._parameters.get(attr)
    if param is not None:
        if param.device.type == "meta":
            owner._parameters[attr] = torch.nn.Parameter(value, requires_grad=param.requires_grad)
        else:
            param.data = value
    else:
        owner._buffers[attr] = value


def offload_dir_of(path: str | os.PathLike | None) -> str | None:
    return os.fspath(path) if path is not None else None
