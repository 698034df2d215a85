"""FSDP1 (``fsdp_version=1``): torch's ``FullyShardedDataParallel`` wrapper, for scripts and configs written
for it. FSDP2 (the default) is what the rest of the plugin builds on; FSDP1 takes the same plugin fields,
passed to the wrapper under their FSDP1 meaning (sharding strategy, CPUOffload, MixedPrecision,
backward/forward prefetch, limit_all_gathers, use_orig_params, sync_module_states, param_init_fn).

It runs on CPU with gloo as well as on GPUs. Not available with FSDP1 here: a ``ParallelismConfig`` (N-D
layouts are FSDP2's), and ``activation_checkpointing_offload`` (FSDP2 only, as in Accelerate).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator
from drivetrain.plugin_api.checkpoint import safe_dcp_load
from drivetrain_fsdp.config import BackwardPrefetch, FullyShardedDataParallelPlugin


def is_fsdp1(model: Any) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def wrap_fsdp1(
    model: torch.nn.Module, config: FullyShardedDataParallelPlugin, accelerator: PluginAccelerator
) -> torch.nn.Module:
    """``FullyShardedDataParallel(model, ...)`` with the plugin's settings; returns the wrapper (its
    ``.module`` is the user's model, which ``accelerator.unwrap_model`` returns)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import BackwardPrefetch as TorchBackwardPrefetch
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp import ShardingStrategy as TorchShardingStrategy
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    from drivetrain_fsdp.bookkeeping import CONFIG_ATTRIBUTE, FLATTENED, replaced_parameters
    from drivetrain_fsdp.process_group import device_mesh
    from drivetrain_fsdp.units import ignored_modules, modules_to_wrap

    if accelerator.parallelism_config is not None and accelerator.parallelism_config.total_size > 1:
        raise ConfigurationError(
            "FullyShardedDataParallelPlugin.fsdp_version=1 does not take a ParallelismConfig: tensor, context and "
            "hybrid layouts are built on FSDP2 (fsdp_version=2); for FSDP1's hybrid sharding use "
            "sharding_strategy=HYBRID_SHARD"
        )
    ignored = ignored_modules(model, config)
    chosen = {id(module) for module in modules_to_wrap(model, config, ignored)}
    policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda module: id(module) in chosen)
    prefetch = {
        BackwardPrefetch.BACKWARD_PRE: TorchBackwardPrefetch.BACKWARD_PRE,
        BackwardPrefetch.BACKWARD_POST: TorchBackwardPrefetch.BACKWARD_POST,
    }.get(config.backward_prefetch)
    kwargs: dict[str, Any] = {
        "sharding_strategy": TorchShardingStrategy[config.sharding_strategy.value],
        "auto_wrap_policy": policy if chosen else None,
        "cpu_offload": config.cpu_offload,
        "mixed_precision": config.mixed_precision_policy,
        "backward_prefetch": prefetch,
        "forward_prefetch": config.forward_prefetch,
        "limit_all_gathers": config.limit_all_gathers,
        "use_orig_params": config.use_orig_params,
        "sync_module_states": config.sync_module_states_enabled,
        "param_init_fn": config.param_init_fn,
        "ignored_modules": ignored or None,
        "device_id": accelerator.device,
    }
    if config.is_hybrid:
        kwargs["device_mesh"] = device_mesh(config, accelerator)
    if config.sync_module_states_enabled and config.param_init_fn is None:
        device = accelerator.device
        kwargs["param_init_fn"] = lambda module: module.to_empty(device=device, recurse=False)

    original = dict(model.named_parameters())
    wrapped = FullyShardedDataParallel(model, **kwargs)
    if config.activation_checkpointing:
        check = (
            (lambda module: id(module) in chosen)
            if chosen
            else (lambda module: module in set(model.children()))
        )
        wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        apply_activation_checkpointing(wrapped, checkpoint_wrapper_fn=wrapper, check_fn=check)

    # With use_orig_params the optimizer may keep the user's parameters: FSDP1 keeps those very objects when
    # it can, and maps the rest by name. Without it, parameters are flattened per unit and an optimizer must
    # be built after prepare from model.parameters().
    if config.use_orig_params:
        now = {_clean_name(name): parameter for name, parameter in wrapped.named_parameters()}
        for name, parameter in original.items():
            replacement = now.get(name)
            if replacement is not None and replacement is not parameter:
                replaced_parameters[parameter] = replacement
    else:
        for parameter in original.values():
            replaced_parameters[parameter] = FLATTENED
    _add_state_dict_method(wrapped)
    wrapped.__dict__[CONFIG_ATTRIBUTE] = config
    return wrapped


def _clean_name(name: str) -> str:
    """A parameter name of the wrapped model without FSDP1's and checkpointing's wrapper prefixes."""
    for prefix in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
        name = name.replace(prefix, "")
    return name


def clip_grad_norm(model: Any, max_norm: float, norm_type: float) -> torch.Tensor:
    """FSDP1 clips through the root wrapper, over every rank's shard."""
    return model.clip_grad_norm_(max_norm, norm_type)


def offload_to_cpu(model: Any, config: FullyShardedDataParallelPlugin) -> bool:
    """Whether gathered state dicts go to host memory: the state dict configuration says so, except FSDP1 on
    a CPU device, whose offloading copy crashes there (the tensors are on the host already)."""
    wanted = bool(getattr(config.state_dict_config, "offload_to_cpu", True))
    if is_fsdp1(model) and model.compute_device.type == "cpu":
        return False
    return wanted


class _FullStateDict:
    """The kernel's ``full_state_dict()`` model protocol on an FSDP1 wrapper (its own ``no_sync`` stays)."""

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        offload = self.compute_device.type != "cpu"  # type: ignore[attr-defined]
        options = StateDictOptions(full_state_dict=True, cpu_offload=offload)
        state: Any = get_model_state_dict(self, options=options)  # type: ignore[arg-type]
        import torch.distributed as dist

        return state if dist.get_rank() == 0 else {}


_classes: dict[type, type] = {}


def _add_state_dict_method(wrapped: torch.nn.Module) -> None:
    cls = type(wrapped)
    if cls not in _classes:
        _classes[cls] = type(cls.__name__, (_FullStateDict, cls), {"__module__": cls.__module__})
    wrapped.__class__ = _classes[cls]


def optimizer_state(
    model: Any, optimizer: torch.optim.Optimizer, full: bool, offload: bool
) -> dict[str, Any]:
    """FSDP1's optimizer state dict: full (gathered) or sharded (for torch.distributed.checkpoint)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

    if full:
        return get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=offload)
        )
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        return FullyShardedDataParallel.optim_state_dict(model, optimizer)


def load_sharded_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, folder: str, key: str) -> None:
    """Read an FSDP1 sharded optimizer checkpoint folder into ``optimizer``."""
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

    _initialise_state(optimizer)  # the template must hold every entry the checkpoint has
    state = {key: optimizer_state(model, optimizer, full=False, offload=False)}
    # Kept whole: flattening a ShardedTensor with no shard on this rank (a small parameter) drops its key,
    # and DCP would then read the folder as an old-format checkpoint.
    safe_dcp_load(state, folder, flatten_sharded_tensors=False)
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        flat = FullyShardedDataParallel.optim_state_dict_to_load(model, optimizer, state[key])
    optimizer.load_state_dict(flat)


def _initialise_state(optimizer: torch.optim.Optimizer) -> None:
    """Give an optimizer that never stepped its state entries (one step on zero gradients with a learning
    rate of 0, which leaves the parameters as they are); the loaded state replaces them."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if any(p.grad is not None for p in params):
        return
    for parameter in params:
        parameter.grad = torch.zeros_like(parameter)
    rates = [group.get("lr") for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
    optimizer.step()
    for group, rate in zip(optimizer.param_groups, rates):
        if rate is not None:
            group["lr"] = rate
    optimizer.zero_grad(set_to_none=True)
