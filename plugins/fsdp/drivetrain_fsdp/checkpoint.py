"""Checkpoints of sharded models: SHARDED through torch.distributed.checkpoint (each rank writes its own
shard; loading reshards onto any number of processes) or FULL (gathered to rank 0 on CPU, one file).

Folder layout inside a checkpoint (Accelerate's names):

* SHARDED: ``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/`` (DCP folders: ``.metadata`` + ``__<rank>_0.distcp``);
* FULL: ``model.safetensors`` (``model_<i>.safetensors``, or ``pytorch_model*.bin``) and ``optimizer.bin``.

Loading looks at what the folder holds, so a checkpoint loads whatever ``state_dict_type`` is set now.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from drivetrain.plugin_api import CheckpointError, PluginAccelerator
from drivetrain.plugin_api.checkpoint import (
    checkpoint_path,
    model_file_name,
    optimizer_file_name,
    read_scheduler_state,
    safe_dcp_load,
    safe_load,
    scheduler_file_name,
    torch_save_into_checkpoint,
    write_model_weights,
    writes_shared_files,
)
from drivetrain_fsdp.bookkeeping import CONFIG_ATTRIBUTE
from drivetrain_fsdp.config import FullyShardedDataParallelPlugin, StateDictType

MODEL_FOLDER = "pytorch_model_fsdp"
OPTIMIZER_FOLDER = "optimizer"
#: Top-level key of the model (and optimizer) state inside a DCP folder; merge_fsdp_weights strips it.
MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"


def model_folder(output_dir: str, index: int) -> str:
    return os.path.join(output_dir, f"{MODEL_FOLDER}_{index}")


def optimizer_folder(output_dir: str, index: int) -> str:
    return os.path.join(output_dir, f"{OPTIMIZER_FOLDER}_{index}")


def _options(full: bool, **kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, **kwargs)


def _module(model: torch.nn.Module, accelerator: PluginAccelerator) -> torch.nn.Module:
    """The sharded module itself: fully_shard works in place (torch.compile wraps it); FSDP1's wrapper is
    the module torch's state-dict functions take."""
    from drivetrain_fsdp.fsdp1 import is_fsdp1

    inner = getattr(model, "_orig_mod", model)
    if is_fsdp1(inner):
        return inner
    return accelerator.unwrap_model(model, keep_torch_compile=False)


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)


def owner_of(optimizer: torch.optim.Optimizer, modules: list[torch.nn.Module]) -> torch.nn.Module:
    """The model whose parameters ``optimizer`` updates (its state dict is keyed by that model's names)."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules:
        if wanted <= {id(p) for p in module.parameters()}:
            return module
    raise CheckpointError(
        f"{type(optimizer).__name__} updates parameters of several prepared models (or of none); the fsdp "
        "backend saves an optimizer together with the one model it belongs to: use one optimizer per model"
    )


def _config(
    module: torch.nn.Module, fallback: FullyShardedDataParallelPlugin
) -> FullyShardedDataParallelPlugin:
    return module.__dict__.get(CONFIG_ATTRIBUTE, fallback)


def save(
    output_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
    safe_serialization: bool,
    config: FullyShardedDataParallelPlugin,
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from drivetrain_fsdp.fsdp1 import is_fsdp1, offload_to_cpu, optimizer_state

    writer = writes_shared_files(accelerator)
    modules = [_module(model, accelerator) for model in models]
    for index, module in enumerate(modules):
        if _config(module, config).state_dict_type == StateDictType.SHARDED_STATE_DICT:
            dcp.save({MODEL_KEY: get_model_state_dict(module)}, checkpoint_id=model_folder(output_dir, index))
        else:
            offload = offload_to_cpu(module, _config(module, config))
            state: Any = get_model_state_dict(module, options=_options(True, cpu_offload=offload))
            if writer:
                write_model_weights(
                    state,
                    os.path.join(output_dir, model_file_name(index, safe_serialization)),
                    safe_serialization,
                )
    all_modules = [_module(model, accelerator) for model in accelerator.prepared.models]
    for index, optimizer in enumerate(optimizers):
        inner = _inner(optimizer)
        module = owner_of(inner, all_modules)
        full = _config(module, config).state_dict_type != StateDictType.SHARDED_STATE_DICT
        offload = offload_to_cpu(module, _config(module, config))
        if is_fsdp1(module):
            state = optimizer_state(module, inner, full=full, offload=offload)
        elif full:
            state = get_optimizer_state_dict(module, inner, options=_options(True, cpu_offload=offload))
        else:
            state = get_optimizer_state_dict(module, inner)
        if not full:
            dcp.save({OPTIMIZER_KEY: state}, checkpoint_id=optimizer_folder(output_dir, index))
        else:
            if writer:
                torch_save_into_checkpoint(state, os.path.join(output_dir, optimizer_file_name(index)))
    if writer:
        for index, scheduler in enumerate(schedulers):
            torch_save_into_checkpoint(
                scheduler.state_dict(), os.path.join(output_dir, scheduler_file_name(index))
            )


def _held(input_dir: str, name: str, folder: bool = False) -> str | None:
    """The path of ``name`` if the checkpoint holds it (listed in its manifest: a file beside the
    checkpoint's own is never read), as a file, or as a folder with ``folder``."""
    path = checkpoint_path(input_dir, name)
    if path is None or not (os.path.isdir(path) if folder else os.path.isfile(path)):
        return None
    return path


def _full_model_file(input_dir: str, index: int) -> str | None:
    for safe in (True, False):
        path = _held(input_dir, model_file_name(index, safe))
        if path is not None:
            return path
    return None


def load(
    input_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from drivetrain_fsdp.fsdp1 import is_fsdp1, load_sharded_optimizer_state

    is_rank0 = dist.get_rank() == 0
    # Read and checked before any model changes: applying them cannot fail after the weights are in.
    scheduler_states = [
        read_scheduler_state(input_dir, index, scheduler, "cpu", load_kwargs)
        for index, scheduler in enumerate(schedulers)
    ]
    modules = [_module(model, accelerator) for model in models]
    for index, module in enumerate(modules):
        folder = model_folder(input_dir, index)
        if _held(input_dir, os.path.basename(folder), folder=True):
            state = {MODEL_KEY: get_model_state_dict(module)}
            safe_dcp_load(state, folder)
            set_model_state_dict(module, state[MODEL_KEY])
            continue
        path = _full_model_file(input_dir, index)
        if path is None:
            raise CheckpointError(
                f"{input_dir} holds no weights for model {index} (neither {os.path.basename(folder)}/ nor "
                f"{model_file_name(index, True)}); was it saved with the same number of prepared models?"
            )
        full: dict[str, Any] = {}
        if is_rank0:
            if path.endswith(".safetensors"):
                from safetensors.torch import load_file

                full = load_file(path)
            else:
                full = safe_load(path, map_location="cpu", **load_kwargs)
        set_model_state_dict(module, full, options=_options(True, broadcast_from_rank0=True))

    all_modules = [_module(model, accelerator) for model in accelerator.prepared.models]
    for index, optimizer in enumerate(optimizers):
        inner = _inner(optimizer)
        module = owner_of(inner, all_modules)
        folder = optimizer_folder(input_dir, index)
        sharded = _held(input_dir, os.path.basename(folder), folder=True) is not None
        if sharded and is_fsdp1(module):
            load_sharded_optimizer_state(module, inner, folder, OPTIMIZER_KEY)
            continue
        if sharded:
            loaded: dict[str, Any] = {OPTIMIZER_KEY: get_optimizer_state_dict(module, inner)}
            safe_dcp_load(loaded, folder)
            set_optimizer_state_dict(module, inner, loaded[OPTIMIZER_KEY])
            continue
        path = _held(input_dir, optimizer_file_name(index))
        if path is None:
            raise CheckpointError(
                f"{input_dir} holds no state for optimizer {index} (neither "
                f"{os.path.basename(folder)}/ nor {optimizer_file_name(index)})"
            )
        full_state = safe_load(path, map_location="cpu", **load_kwargs) if is_rank0 else {}
        set_optimizer_state_dict(module, inner, full_state, options=_options(True, broadcast_from_rank0=True))

    for scheduler, state in zip(schedulers, scheduler_states):
        scheduler.load_state_dict(state)
