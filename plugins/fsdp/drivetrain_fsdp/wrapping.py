"""Turning a user's model into an FSDP2 model: wrap policy, activation checkpointing, ``fully_shard``
bottom-up, and (with ``sync_module_states``) rank 0's weights broadcast into every rank's shards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator
from drivetrain_fsdp.bookkeeping import CONFIG_ATTRIBUTE, replaced_parameters
from drivetrain_fsdp.config import (
    BackwardPrefetch,
    FullyShardedDataParallelPlugin,
    ShardingStrategy,
)
from drivetrain_fsdp.process_group import device_mesh
from drivetrain_fsdp.units import ignored_modules, modules_to_wrap


class DrivetrainFSDPModule:
    """Methods the kernel finds on a sharded model by duck typing (mixed into its class)."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally, without reduce-scatter, until the block ends.

        Memory caveat: inside the block each rank keeps **unsharded** gradients (the full size of every
        parameter), so accumulating under ``no_sync`` costs as much gradient memory as DDP.
        """
        toggle = getattr(self, "set_requires_gradient_sync", None)  # absent with tensor parallelism alone
        if toggle is None:
            yield
            return
        toggle(False)
        try:
            yield
        finally:
            toggle(True)

    @contextlib.contextmanager
    def trigger_sync_in_backward(self) -> Iterator[None]:
        """Reduce gradients in the next backward even inside ``no_sync`` (FSDP2 decides at backward time)."""
        toggle = getattr(self, "set_requires_gradient_sync", None)
        if toggle is None:
            yield
            return
        toggle(True)
        try:
            yield
        finally:
            toggle(False)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer gathered to rank 0 on CPU (other ranks get ``{}``). Collective: call
        it on every rank. Never holds the whole model on one accelerator."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state: Any = get_model_state_dict(self, options=options)  # type: ignore[arg-type]
        return state


_mixed_classes: dict[type, type] = {}


def _add_drivetrain_methods(model: torch.nn.Module) -> None:
    cls = type(model)
    if cls not in _mixed_classes:
        _mixed_classes[cls] = type(cls.__name__, (DrivetrainFSDPModule, cls), {"__module__": cls.__module__})
    model.__class__ = _mixed_classes[cls]


# -- sharding --------------------------------------------------------------------------------------------------
def _fully_shard_kwargs(
    config: FullyShardedDataParallelPlugin, mesh: Any, ignored_params: set
) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": config.effective_reshard_after_forward}
    if config.mixed_precision_policy is not None:
        kwargs["mp_policy"] = config.mixed_precision_policy
    else:
        kwargs["mp_policy"] = MixedPrecisionPolicy()
    if isinstance(config.cpu_offload, CPUOffloadPolicy):
        kwargs["offload_policy"] = config.cpu_offload
    if ignored_params:
        kwargs["ignored_params"] = ignored_params
    return kwargs


def _set_prefetching(units: list[torch.nn.Module], config: FullyShardedDataParallelPlugin) -> None:
    """FSDP2 prefetches the previous unit's all-gather in backward by itself (BACKWARD_PRE); the other
    settings are expressed through its explicit prefetch lists."""
    # units are bottom-up; for a stack of blocks that is the reverse of the forward order.
    forward_order = units[::-1]
    if config.forward_prefetch:
        for current, following in zip(forward_order, forward_order[1:]):
            current.set_modules_to_forward_prefetch([following])  # type: ignore[operator]
    if config.backward_prefetch == BackwardPrefetch.NO_PREFETCH:
        for unit in units:
            unit.set_modules_to_backward_prefetch([])  # type: ignore[operator]


def data_parallel_layout(
    config: FullyShardedDataParallelPlugin, accelerator: PluginAccelerator
) -> tuple[str | None, Any]:
    """How the model is spread over the data-parallel processes: ``("shard", mesh)`` (FSDP, or HSDP over a
    2-D mesh), ``("replicate", mesh)`` (full copies, gradients all-reduced) or ``(None, None)`` (no
    data-parallel dimension: tensor parallelism alone).

    With a ``ParallelismConfig`` the mesh is the run's (``dp_replicate`` x ``dp_shard_cp``); without one it
    follows ``sharding_strategy`` as in Accelerate."""
    parallelism = accelerator.parallelism_config
    mesh = accelerator.torch_device_mesh
    if parallelism is None or mesh is None:
        return "shard", device_mesh(config, accelerator)
    if config.is_hybrid or config.sharding_strategy == ShardingStrategy.NO_SHARD:
        raise ConfigurationError(
            f"FullyShardedDataParallelPlugin.sharding_strategy={config.sharding_strategy.value} and a "
            "ParallelismConfig both describe the mesh; with a ParallelismConfig set dp_replicate_size / "
            "dp_shard_size instead (HYBRID_SHARD is dp_replicate x dp_shard, NO_SHARD is dp_replicate)"
        )
    if parallelism.dp_shard_cp_dim_names:
        return "shard", parallelism.submesh(mesh, *parallelism.fsdp_dim_names)
    if parallelism.dp_replicate_enabled:
        return "replicate", mesh["dp_replicate"]
    return None, None


def shard_model(
    model: torch.nn.Module, config: FullyShardedDataParallelPlugin, accelerator: PluginAccelerator
) -> torch.nn.Module:
    """Apply ``config`` (and the run's ``ParallelismConfig``) to ``model`` in place and return it: tensor
    parallelism over ``tp``, then FSDP2 over the data-parallel dimensions (an ``FSDPModule``)."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import fully_shard

    if config.sync_module_states is None and not config.cpu_ram_efficient_loading_enabled:
        _replicas_from_rank0(model, accelerator)
    if config.fsdp_version == 1:
        from drivetrain_fsdp.fsdp1 import wrap_fsdp1

        return wrap_fsdp1(model, config, accelerator)
    kind, mesh = data_parallel_layout(config, accelerator)
    parallelism = accelerator.parallelism_config
    tensor_parallel = parallelism is not None and parallelism.tp_enabled
    ignored = ignored_modules(model, config)
    ignored_params = {p for module in ignored for p in module.parameters()}
    units = modules_to_wrap(model, config, ignored)
    if config.activation_checkpointing:
        # Composable checkpointing keeps parameter names unchanged (no wrapper module in the state dict).
        targets = units or [child for child in model.children() if any(True for _ in child.parameters())]
        for module in targets:
            if config.activation_checkpointing_offload:
                _offload_saved_inputs(module)  # registered first: it must enclose checkpoint's own hooks
            checkpoint(module)

    original_parameters = {name: parameter for name, parameter in model.named_parameters()}
    device = accelerator.device
    broadcast = config.sync_module_states_enabled and accelerator.num_processes > 1
    if broadcast and tensor_parallel:
        raise ConfigurationError(
            "FullyShardedDataParallelPlugin.sync_module_states / cpu_ram_efficient_loading with ParallelismConfig."
            "tp_size > 1 is not supported: build the model on every rank"
        )
    source_state: dict[str, torch.Tensor] = {}
    source_buffers: dict[str, torch.Tensor] = {}
    if broadcast:
        if accelerator.is_main_process:
            source_state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
            source_buffers = {name: buffer.detach() for name, buffer in model.named_buffers()}
        # Every rank shards empty (meta) tensors; rank 0's weights arrive by broadcast into the shards, so no
        # rank but 0 ever holds the full model in host memory.
        model.to("meta")
    else:
        model.to(device)

    if tensor_parallel:
        from drivetrain_fsdp.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, accelerator.torch_device_mesh, parallelism.tp_handler)
    if parallelism is not None and parallelism.cp_enabled:
        from drivetrain_fsdp.context_parallel import attach_attention_mask_hooks

        attach_attention_mask_hooks(model)

    if kind == "shard":
        kwargs = _fully_shard_kwargs(config, mesh, ignored_params)
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        _set_prefetching(units, config)
    elif kind == "replicate":
        from torch.distributed._composable.replicate_with_fsdp import replicate

        kwargs = _fully_shard_kwargs(config, mesh, ignored_params)
        kwargs.pop("reshard_after_forward")
        for unit in units:
            replicate(unit, **kwargs)
        replicate(model, **kwargs)

    if broadcast:
        _broadcast_from_rank0(model, source_state, source_buffers, device, config.param_init_fn)
        del source_state, source_buffers

    sharded = dict(model.named_parameters())
    for name, parameter in original_parameters.items():
        if name in sharded and sharded[name] is not parameter:
            replaced_parameters[parameter] = sharded[name]
    _add_drivetrain_methods(model)
    model.__dict__[CONFIG_ATTRIBUTE] = config
    return model


def _replicas_from_rank0(model: torch.nn.Module, accelerator: PluginAccelerator) -> None:
    """Every rank starts from rank 0's weights, as DDP does when it wraps (and Accelerate's FSDP1, whose
    ``sync_module_states`` defaults to on): processes seeded differently still train one model. Every rank
    holds the whole model here, so this costs one broadcast of it and no memory; ``sync_module_states=True``
    (or ``cpu_ram_efficient_loading``) takes the meta-device path instead, ``sync_module_states=False`` skips
    it. Tensors already distributed (a model sharded by ``from_pretrained(tp_plan=...)``) are left alone."""
    import torch.distributed as dist

    if accelerator.num_processes < 2 or not dist.is_initialized():
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_meta or hasattr(tensor, "device_mesh"):
                continue
            detached = tensor.detach()
            on_device = detached.to(accelerator.device)
            dist.broadcast(on_device, src=0)
            if on_device is not detached:
                detached.copy_(on_device)


def _offload_saved_inputs(module: torch.nn.Module) -> None:
    """While ``module`` runs forward, tensors saved for backward outside its checkpoint (the inputs the
    checkpoint keeps for its recompute) go to host memory (``save_on_cpu``), pinned when there is an
    accelerator: Accelerate's ``activation_checkpointing_offload``."""
    from torch.distributed._composable import checkpoint

    entered: list[Any] = []

    def enter(_module: torch.nn.Module, _args: Any) -> None:
        # Not while backward recomputes the unit (checkpoint turns its own hooks off then): the recompute
        # must save exactly what the first forward saved.
        context = None
        if checkpoint.state(module).enable_hook:
            context = torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())
            context.__enter__()
        entered.append(context)

    def leave(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
        context = entered.pop()
        if context is not None:
            context.__exit__(None, None, None)

    module.register_forward_pre_hook(enter, prepend=True)
    module.register_forward_hook(leave, always_call=True)


def _broadcast_from_rank0(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    device: torch.device,
    param_init_fn: Any = None,
) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if param_init_fn is None:
        model.to_empty(device=device)
    else:
        # The user's materialisation, module by module, as FSDP1 applies param_init_fn.
        for module in model.modules():
            if any(t.is_meta for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]):
                param_init_fn(module)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, cast(Any, state), options=options)
    # Non-persistent buffers (rotary tables, masks) are not in the state dict; they are not sharded either.
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if dist.get_rank() == 0 and name in buffers:
                buffer.copy_(buffers[name])
            dist.broadcast(buffer, src=0)
