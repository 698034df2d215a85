"""The fsdp plugin's hook implementations (FSDP2: ``torch.distributed.fsdp.fully_shard`` on a device mesh).

The kernel's ``no_sync`` / ``trigger_sync_in_backward`` find the methods of the same names on the sharded
model (:class:`~drivetrain_fsdp.wrapping.DrivetrainFSDPModule`), and ``full_state_dict()`` gathers the
whole model to rank 0 on CPU.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import (
    Capabilities,
    ConfigurationError,
    DistributedType,
    PluginAccelerator,
    PluginInfo,
)
from drivetrain.plugin_api.settings import resolve_backend_config
from drivetrain_fsdp.config import READER, FullyShardedDataParallelPlugin

PLUGIN_INFO = PluginInfo(
    kind="backend",
    description="PyTorch FSDP2: parameters, gradients and optimizer state sharded across processes",
    # FSDP2 keeps the gradients accumulated under no_sync() unsharded inside its parameters' state, not in
    # param.grad: local_gradients=False (plugins/fsdp/tests check accumulation equals the full batch).
    capabilities=Capabilities(
        multi_process=True,
        sharded_state=True,
        precisions=("no", "bf16", "fp16"),
        devices=("cpu", "cuda"),
        local_gradients=False,
        # dp_shard first: a ParallelismConfig() of all ones shards over every process. sp is DeepSpeed's.
        mesh_dimensions=("dp_shard", "dp_replicate", "tp", "cp"),
    ),
    distributed_type="FSDP",
    config_section="fsdp_config",
    launch_flag="use_fsdp",
    # The backend places parameters itself: each rank materialises only its shard (and with
    # cpu_ram_efficient_loading only rank 0 ever holds the full weights).
    places_model=True,
    # Accelerate's get_grad_scaler(distributed_type=FSDP) gives torch's sharded scaler.
    grad_scaler="torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler",
)


def resolve_config(given: Any) -> FullyShardedDataParallelPlugin:
    """The script's FullyShardedDataParallelPlugin with the fields it leaves unset taken from launch flags / the
    config file, or the one built from those alone when the script passed none. Resolved once per run by the
    kernel, so that the Accelerator, its checkpoints and ``AcceleratorState().fsdp_plugin`` share it
    (``set_state_dict_type`` on it changes what the next save writes)."""
    return resolve_backend_config(READER, given)


def active_config(accelerator: PluginAccelerator) -> FullyShardedDataParallelPlugin:
    """The configuration of the Accelerator's run (see :func:`resolve_config`)."""
    return resolve_config(accelerator.state.backend_config)


def _state_fsdp_plugin(state: Any) -> FullyShardedDataParallelPlugin | None:
    """``AcceleratorState().fsdp_plugin``: the active configuration in an fsdp run, None in others (as in
    Accelerate)."""
    if getattr(state, "distributed_type", None) != DistributedType.FSDP:
        return None
    return resolve_config(state.backend_config)


@hookimpl
def register_extensions(registry: Any) -> None:
    from drivetrain_fsdp import launch_options, merge, to_fsdp2

    registry.add_command(
        "merge-weights",
        merge.register_parser,
        merge.run,
        help="merge a sharded FSDP checkpoint into one safetensors model",
    )
    registry.add_command(
        "to-fsdp2",
        to_fsdp2.register_parser,
        to_fsdp2.run,
        help="convert a config file's FSDP1 settings to FSDP2",
    )
    registry.add_launch_options(launch_options.add_arguments)
    registry.add_state_attribute("fsdp_plugin", _state_fsdp_plugin, on_accelerator=False)


@hookimpl
def setup_process_group(
    device: torch.device, init_kwargs: dict[str, Any], parallelism: Any, backend_config: Any
) -> Any:
    from drivetrain_fsdp.process_group import join

    resolve_config(
        backend_config
    )  # a conflict with the launcher stops Accelerator(...), not its first prepare()
    return join(device, init_kwargs, parallelism)


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    # evaluation_mode shards too: FSDP is about fitting the model in memory, which inference needs as well.
    from torch.distributed.fsdp import FSDPModule

    from drivetrain_fsdp.bookkeeping import CONFIG_ATTRIBUTE
    from drivetrain_fsdp.fsdp1 import is_fsdp1
    from drivetrain_fsdp.wrapping import shard_model

    if isinstance(model, FSDPModule) or is_fsdp1(model) or CONFIG_ATTRIBUTE in model.__dict__:
        return None
    if len(set(getattr(model, "hf_device_map", {}).values())) > 1:
        raise ConfigurationError(
            "this model was dispatched across several devices with a device_map; the fsdp backend shards a "
            "model that is whole on one device (load it without device_map)"
        )
    return shard_model(model, active_config(accelerator), accelerator)


@hookimpl
def wrap_optimizer(
    optimizer: torch.optim.Optimizer, accelerator: PluginAccelerator
) -> torch.optim.Optimizer | None:
    from drivetrain_fsdp.training import rebind_optimizer

    rebind_optimizer(optimizer)
    return optimizer


@hookimpl
def clip_grad_norm(
    parameters: list, max_norm: float, norm_type: float, accelerator: PluginAccelerator
) -> torch.Tensor | None:
    from drivetrain_fsdp.fsdp1 import is_fsdp1
    from drivetrain_fsdp.training import clip_grad_norm as clip

    wanted = {id(p) for p in parameters}
    for model in accelerator.prepared.models:
        inner = getattr(model, "_orig_mod", model)
        if is_fsdp1(inner) and wanted & {id(p) for p in inner.parameters()}:
            # FSDP1 keeps flat shards: only the root wrapper knows the norm across them.
            return cast(Any, inner).clip_grad_norm_(max_norm, norm_type)
    return clip(parameters, max_norm, norm_type)


@hookimpl
def autocast(accelerator: PluginAccelerator) -> contextlib.AbstractContextManager | None:
    # With a mixed precision policy FSDP2 already runs every unit in param_dtype (module-level casting);
    # op-level autocast on top would only add casts. Without one, the reference autocast applies.
    policy = active_config(accelerator).mixed_precision_policy
    if policy is not None and policy.param_dtype is not None:
        return contextlib.nullcontext()
    return None


@hookimpl
def save_state(
    output_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
    safe_serialization: bool,
) -> bool:
    from drivetrain_fsdp import checkpoint

    checkpoint.save(
        output_dir,
        accelerator,
        models,
        optimizers,
        schedulers,
        safe_serialization,
        active_config(accelerator),
    )
    return True


@hookimpl
def load_state(
    input_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
) -> bool:
    from drivetrain_fsdp import checkpoint

    checkpoint.load(input_dir, accelerator, models, optimizers, schedulers, map_location, load_kwargs)
    return True
