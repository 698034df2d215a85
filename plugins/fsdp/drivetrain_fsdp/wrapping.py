"""Turning a user's model into an FSDP2 model: wrap policy, activation checkpointing, ``fully_shard``
bottom-up, and (with ``sync_module_states``) rank 0's weights broadcast into every rank's shards."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from drivetrain.plugin_api import ConfigurationError
from drivetrain_fsdp.config import AutoWrapPolicy, BackwardPrefetch, FullyShardedDataParallelPlugin
from drivetrain_fsdp.process_group import device_mesh

#: The configuration a model was sharded with (checkpoints follow it, not a later Accelerator's).
CONFIG_ATTRIBUTE = "_drivetrain_fsdp_config"

#: Parameter the user's optimizer may still hold -> the sharded parameter that replaced it.
replaced_parameters: WeakIdKeyDictionary = WeakIdKeyDictionary()


class DrivetrainFSDPModule:
    """Methods the kernel finds on a sharded model by duck typing (mixed into its class)."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally, without reduce-scatter, until the block ends.

        Memory caveat: inside the block each rank keeps **unsharded** gradients (the full size of every
        parameter), so accumulating under ``no_sync`` costs as much gradient memory as DDP.
        """
        self.set_requires_gradient_sync(False)  # type: ignore[attr-defined]
        try:
            yield
        finally:
            self.set_requires_gradient_sync(True)  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def trigger_sync_in_backward(self) -> Iterator[None]:
        """Reduce gradients in the next backward even inside ``no_sync`` (FSDP2 decides at backward time)."""
        self.set_requires_gradient_sync(True)  # type: ignore[attr-defined]
        try:
            yield
        finally:
            self.set_requires_gradient_sync(False)  # type: ignore[attr-defined]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer gathered to rank 0 on CPU (other ranks get ``{}``). Collective: call
        it on every rank. Never holds the whole model on one accelerator."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self, options=options)  # type: ignore[arg-type]


_mixed_classes: dict[type, type] = {}


def _add_drivetrain_methods(model: torch.nn.Module) -> None:
    cls = type(model)
    if cls not in _mixed_classes:
        _mixed_classes[cls] = type(cls.__name__, (DrivetrainFSDPModule, cls), {"__module__": cls.__module__})
    model.__class__ = _mixed_classes[cls]


# -- which modules become FSDP units ------------------------------------------------------------------------
def ignored_modules(model: torch.nn.Module, config: FullyShardedDataParallelPlugin) -> list[torch.nn.Module]:
    if config.ignored_modules is None:
        return []
    if isinstance(config.ignored_modules, str):
        pattern = re.compile(config.ignored_modules)
        return [module for name, module in model.named_modules() if name and pattern.fullmatch(name)]
    owned = {id(module) for module in model.modules()}
    return [module for module in config.ignored_modules if id(module) in owned]


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
    model: torch.nn.Module, config: FullyShardedDataParallelPlugin, ignored: list[torch.nn.Module]
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


def shard_model(
    model: torch.nn.Module, config: FullyShardedDataParallelPlugin, accelerator: Any
) -> torch.nn.Module:
    """Apply ``config`` to ``model`` in place and return it (it is now an ``FSDPModule``)."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh(config, accelerator)
    ignored = ignored_modules(model, config)
    ignored_params = {p for module in ignored for p in module.parameters()}
    units = modules_to_wrap(model, config, ignored)
    if config.activation_checkpointing:
        # Composable checkpointing keeps parameter names unchanged (no wrapper module in the state dict).
        targets = units or [child for child in model.children() if any(True for _ in child.parameters())]
        for module in targets:
            checkpoint(module)

    original_parameters = {name: parameter for name, parameter in model.named_parameters()}
    device = accelerator.device
    broadcast = config.sync_module_states_enabled and accelerator.num_processes > 1
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

    kwargs = _fully_shard_kwargs(config, mesh, ignored_params)
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    _set_prefetching(units, config)

    if broadcast:
        _broadcast_from_rank0(model, source_state, source_buffers, device)
        del source_state, source_buffers

    sharded = dict(model.named_parameters())
    for name, parameter in original_parameters.items():
        if name in sharded and sharded[name] is not parameter:
            replaced_parameters[parameter] = sharded[name]
    _add_drivetrain_methods(model)
    model.__dict__[CONFIG_ATTRIBUTE] = config
    return model


def _broadcast_from_rank0(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    device: torch.device,
) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state, options=options)
    # Non-persistent buffers (rotary tables, masks) are not in the state dict; they are not sharded either.
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if dist.get_rank() == 0 and name in buffers:
                buffer.copy_(buffers[name])
            dist.broadcast(buffer, src=0)
