"""Accelerate's module-level FSDP helpers (``from accelerate.utils import save_fsdp_model, ...``), importable
as ``from drivetrain.utils import save_fsdp_model`` when this plugin is installed.

``Accelerator.save_state`` / ``load_state`` are the usual way to checkpoint; these are for scripts that save a
model or optimizer on their own. They follow Accelerate's file names: a FULL state dict goes to
``pytorch_model_fsdp.bin`` (``pytorch_model_fsdp_<i>.bin``) and ``optimizer.bin`` (``optimizer_<i>.bin``)
written by rank 0; a SHARDED one to ``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/`` through
torch.distributed.checkpoint, or with ``use_dcp=False`` one ``..._rank<r>.bin`` file per rank. Every
function is collective: call it on every process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from drivetrain.plugin_api import CheckpointError, PluginAccelerator
from drivetrain.plugin_api.checkpoint import safe_dcp_load, safe_load
from drivetrain_fsdp.checkpoint import MODEL_FOLDER, MODEL_KEY, OPTIMIZER_FOLDER, OPTIMIZER_KEY
from drivetrain_fsdp.config import FullyShardedDataParallelPlugin, StateDictType

__all__ = [
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_auto_wrap_policy",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]


def _full(plugin: FullyShardedDataParallelPlugin) -> bool:
    return plugin.state_dict_type == StateDictType.FULL_STATE_DICT


def _numbered(stem: str, index: int, suffix: str = ".bin") -> str:
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def _module(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "_orig_mod", model)


def _options(plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from drivetrain_fsdp.fsdp1 import offload_to_cpu

    return StateDictOptions(full_state_dict=_full(plugin), cpu_offload=offload_to_cpu(model, plugin))


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _folder(directory: str | os.PathLike, name: str) -> Path:
    """``directory/name``, or ``directory`` itself when it is that folder already (Accelerate accepts both)."""
    directory = Path(directory)
    return directory if directory.name == name else directory / name


def save_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: PluginAccelerator,
    model: torch.nn.Module,
    output_dir: str | os.PathLike,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Write ``model``'s state dict as ``fsdp_plugin.state_dict_type`` says (see the module docstring).
    ``adapter_only`` (Accelerate's PEFT option) is refused for a PEFT model and, as in Accelerate, changes nothing
    for another."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    _refuse_adapter_only(adapter_only, model)
    model = _module(model)
    os.makedirs(output_dir, exist_ok=True)
    state = get_model_state_dict(model, options=_options(fsdp_plugin, model))
    if _full(fsdp_plugin):
        if _rank() == 0:
            torch.save(state, os.path.join(output_dir, _numbered(MODEL_FOLDER, model_index)))
    elif use_dcp:
        dcp.save({MODEL_KEY: state}, checkpoint_id=str(Path(output_dir) / f"{MODEL_FOLDER}_{model_index}"))
    else:
        torch.save(state, os.path.join(output_dir, f"{MODEL_FOLDER}_{model_index}_rank{_rank()}.bin"))
    _barrier()


def load_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: PluginAccelerator,
    model: torch.nn.Module,
    input_dir: str | os.PathLike,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> Any:
    """Read what :func:`save_fsdp_model` wrote into ``model`` (a sharded checkpoint reshards onto this run's
    processes). Returns torch's missing/unexpected keys result."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    _refuse_adapter_only(adapter_only, model)
    model = _module(model)
    _barrier()
    if _full(fsdp_plugin):
        path = Path(input_dir) / _numbered(MODEL_FOLDER, model_index)
        _require(path)
        state = safe_load(str(path), map_location="cpu") if _rank() == 0 else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        result = set_model_state_dict(model, state, options=options)
    elif use_dcp:
        folder = _folder(input_dir, f"{MODEL_FOLDER}_{model_index}")
        _require(folder)
        state = {MODEL_KEY: get_model_state_dict(model)}
        safe_dcp_load(state, str(folder))
        result = set_model_state_dict(model, state[MODEL_KEY])
    else:
        path = Path(input_dir) / f"{MODEL_FOLDER}_{model_index}_rank{_rank()}.bin"
        _require(path)
        result = set_model_state_dict(model, safe_load(str(path), map_location="cpu"))
    _barrier()
    return result


def save_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: PluginAccelerator,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    output_dir: str | os.PathLike,
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> None:
    """Write ``optimizer``'s state (keyed by ``model``'s parameter names) as the plugin's state dict type says."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from drivetrain_fsdp.fsdp1 import is_fsdp1, offload_to_cpu, optimizer_state

    model, optimizer = _module(model), getattr(optimizer, "optimizer", optimizer)
    os.makedirs(output_dir, exist_ok=True)
    if is_fsdp1(model):
        state = optimizer_state(
            model, optimizer, full=_full(fsdp_plugin), offload=offload_to_cpu(model, fsdp_plugin)
        )
    else:
        state = get_optimizer_state_dict(model, optimizer, options=_options(fsdp_plugin, model))
    if _full(fsdp_plugin):
        if _rank() == 0:
            torch.save(state, os.path.join(output_dir, _numbered(OPTIMIZER_FOLDER, optimizer_index)))
    elif use_dcp:
        folder = Path(output_dir) / f"{OPTIMIZER_FOLDER}_{optimizer_index}"
        dcp.save({OPTIMIZER_KEY: state}, checkpoint_id=str(folder))
    else:
        torch.save(state, os.path.join(output_dir, f"{OPTIMIZER_FOLDER}_{optimizer_index}_rank{_rank()}.bin"))
    _barrier()


def load_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: PluginAccelerator,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    input_dir: str | os.PathLike,
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Read what :func:`save_fsdp_optimizer` wrote into ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from drivetrain_fsdp.fsdp1 import is_fsdp1, load_sharded_optimizer_state

    _refuse_adapter_only(adapter_only, model)
    model, optimizer = _module(model), getattr(optimizer, "optimizer", optimizer)
    _barrier()
    if _full(fsdp_plugin):
        path = Path(input_dir) / _numbered(OPTIMIZER_FOLDER, optimizer_index)
        _require(path)
        state = safe_load(str(path), map_location="cpu") if _rank() == 0 else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(model, optimizer, state, options=options)
    elif use_dcp:
        folder = _folder(input_dir, f"{OPTIMIZER_FOLDER}_{optimizer_index}")
        _require(folder)
        if is_fsdp1(model):
            load_sharded_optimizer_state(model, optimizer, str(folder), OPTIMIZER_KEY)
        else:
            state = {OPTIMIZER_KEY: get_optimizer_state_dict(model, optimizer)}
            safe_dcp_load(state, str(folder))
            set_optimizer_state_dict(model, optimizer, state[OPTIMIZER_KEY])
    else:
        path = Path(input_dir) / f"{OPTIMIZER_FOLDER}_{optimizer_index}_rank{_rank()}.bin"
        _require(path)
        set_optimizer_state_dict(model, optimizer, safe_load(str(path), map_location="cpu"))
    _barrier()


def fsdp2_prepare_model(accelerator: PluginAccelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` in place with the run's FSDP configuration (what ``prepare`` does to a model) and
    return it; a model sharded already is returned as it is."""
    from torch.distributed.fsdp import FSDPModule

    from drivetrain_fsdp.plugin import active_config
    from drivetrain_fsdp.wrapping import shard_model

    if isinstance(_module(model), FSDPModule):
        return model
    return shard_model(model, active_config(accelerator), accelerator)


def fsdp2_load_full_state_dict(
    accelerator: PluginAccelerator,
    model: torch.nn.Module,
    full_sd: dict[str, torch.Tensor],
    cpu_offload: bool = False,
) -> torch.nn.Module:
    """Load a full state dict held by rank 0 (the other ranks may pass ``{}``) into the sharded ``model``:
    each rank receives only its shards. Parameters still on the meta device are allocated first."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(parameter.is_meta for parameter in model.parameters()):
        model.to_empty(device="cpu" if cpu_offload else accelerator.device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=cpu_offload)
    # A copy: torch replaces the dict's entries with this rank's shards, and the caller's dict is theirs.
    set_model_state_dict(model, dict(full_sd) if _rank() == 0 else {}, options=options)
    return model


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict[Any, Any]) -> None:
    """Point ``optimizer``'s param groups at new parameters, in place: ``mapping`` takes an old parameter (or
    its ``data_ptr()``) to its replacement. A parameter without one is an error: the optimizer would update
    tensors the model no longer uses."""
    for group in optimizer.param_groups:
        params = group["params"]
        for index, parameter in enumerate(params):
            replacement = mapping.get(parameter, mapping.get(parameter.data_ptr()))
            if replacement is None:
                raise KeyError(
                    f"fsdp2_switch_optimizer_parameters: no replacement for a parameter of shape {tuple(parameter.shape)}; "
                    "the optimizer would train a tensor the model no longer uses"
                )
            params[index] = replacement


def fsdp2_prepare_auto_wrap_policy(
    fsdp2_plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module
) -> Callable[[torch.nn.Module], bool] | None:
    """The plugin's wrap policy for ``model`` as a ``module -> bool`` function (None: only the root)."""
    from drivetrain_fsdp.units import ignored_modules, modules_to_wrap

    chosen = {
        id(module) for module in modules_to_wrap(model, fsdp2_plugin, ignored_modules(model, fsdp2_plugin))
    }
    if not chosen:
        return None
    return lambda module: id(getattr(module, "_checkpoint_wrapped_module", module)) in chosen


def fsdp2_apply_ac(accelerator: PluginAccelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Activation checkpointing on the units the run's wrap policy picks (composable: parameter names do
    not change); returns ``model``."""
    from torch.distributed._composable import checkpoint

    from drivetrain_fsdp.plugin import active_config

    policy = fsdp2_prepare_auto_wrap_policy(active_config(accelerator), model)
    targets = [
        module for name, module in model.named_modules() if name and policy is not None and policy(module)
    ]
    for module in targets or [child for child in model.children() if any(True for _ in child.parameters())]:
        checkpoint(module)
    return model


def fsdp2_canonicalize_names(named_params: dict[str, Any]) -> dict[str, Any]:
    """Names without the pieces activation checkpointing and torch.compile add (``._checkpoint_wrapped_module``,
    ``_orig_mod.``), so that they match the model's own."""
    canonical = {}
    for name, value in named_params.items():
        name = name.replace("._checkpoint_wrapped_module", "").replace("._orig_mod", "")
        canonical[name.removeprefix("_orig_mod.")] = value
    return canonical


def get_fsdp2_grad_scaler(**kwargs: Any) -> torch.amp.GradScaler:
    """A ``torch.amp.GradScaler`` (FSDP2's gradients are DTensors, which it handles)."""
    return torch.amp.GradScaler(**kwargs)


def _refuse_adapter_only(adapter_only: bool, model: Any) -> None:
    # As Accelerate, adapter_only concerns PEFT models only (transformers' Trainer passes it for every model):
    # for another model the whole state is saved or loaded.
    if adapter_only and _is_peft_model(model):
        raise CheckpointError(
            "adapter_only=True (saving only PEFT adapter weights) is not supported by drivetrain-fsdp; save the "
            "adapter with peft's own save_pretrained"
        )


def _is_peft_model(model: Any) -> bool:
    module = _module(model)
    return hasattr(module, "peft_config") and hasattr(module, "get_base_model")


def _require(path: Path) -> None:
    if not path.exists():
        raise CheckpointError(
            f"{path} not found: was it written by the matching save_fsdp_* with these settings?"
        )
