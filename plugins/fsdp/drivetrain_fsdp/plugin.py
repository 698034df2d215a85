"""The fsdp plugin's hook implementations (FSDP2: ``torch.distributed.fsdp.fully_shard`` on a device mesh).

The kernel's ``no_sync`` / ``trigger_sync_in_backward`` find the methods of the same names on the sharded
model (:class:`~drivetrain_fsdp.wrapping.DrivetrainFSDPModule`), and ``full_state_dict()`` gathers the
whole model to rank 0 on CPU.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, ConfigurationError, PluginInfo
from drivetrain_fsdp.config import FullyShardedDataParallelPlugin, from_environment, merged_with_environment

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
    ),
    distributed_type="FSDP",
    config_section="fsdp_config",
    launch_flag="use_fsdp",
    # The backend places parameters itself: each rank materialises only its shard (and with
    # cpu_ram_efficient_loading only rank 0 ever holds the full weights).
    places_model=True,
)

_configs: weakref.WeakKeyDictionary[Any, FullyShardedDataParallelPlugin] = weakref.WeakKeyDictionary()


def active_config(accelerator: Any) -> FullyShardedDataParallelPlugin:
    """The Accelerator's FullyShardedDataParallelPlugin merged with launch flags / the config file, or the
    one built from those alone when the script passed none."""
    if accelerator not in _configs:
        given = accelerator.state.backend_config
        if given is None:
            config = from_environment()
        elif isinstance(given, FullyShardedDataParallelPlugin):
            config = merged_with_environment(given)
        else:
            raise ConfigurationError(
                f"the fsdp backend takes a FullyShardedDataParallelPlugin as its configuration, got "
                f"{type(given).__name__}"
            )
        _configs[accelerator] = config
    return _configs[accelerator]


@hookimpl
def register_extensions(registry: Any) -> None:
    from drivetrain_fsdp import launch_options, merge

    registry.add_command(
        "merge-weights",
        merge.register_parser,
        merge.run,
        help="merge a sharded FSDP checkpoint into one safetensors model",
    )
    registry.add_launch_options(launch_options.add_arguments)


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> Any:
    from drivetrain_fsdp.process_group import join

    return join(device, init_kwargs)


@hookimpl
def wrap_model(model: torch.nn.Module, accelerator: Any, evaluation_mode: bool) -> torch.nn.Module | None:
    # evaluation_mode shards too: FSDP is about fitting the model in memory, which inference needs as well.
    from torch.distributed.fsdp import FSDPModule

    from drivetrain_fsdp.wrapping import shard_model

    if isinstance(model, FSDPModule):
        return None
    if len(set(getattr(model, "hf_device_map", {}).values())) > 1:
        raise ConfigurationError(
            "this model was dispatched across several devices with a device_map; the fsdp backend shards a "
            "model that is whole on one device (load it without device_map)"
        )
    return shard_model(model, active_config(accelerator), accelerator)


@hookimpl
def wrap_optimizer(optimizer: torch.optim.Optimizer, accelerator: Any) -> torch.optim.Optimizer | None:
    from drivetrain_fsdp.training import rebind_optimizer

    rebind_optimizer(optimizer)
    return optimizer


@hookimpl
def clip_grad_norm(parameters: list, max_norm: float, norm_type: float) -> torch.Tensor | None:
    from drivetrain_fsdp.training import clip_grad_norm as clip

    return clip(parameters, max_norm, norm_type)


@hookimpl
def autocast(accelerator: Any) -> contextlib.AbstractContextManager | None:
    # With a mixed precision policy FSDP2 already runs every unit in param_dtype (module-level casting);
    # op-level autocast on top would only add casts. Without one, the reference autocast applies.
    policy = active_config(accelerator).mixed_precision_policy
    if policy is not None and policy.param_dtype is not None:
        return contextlib.nullcontext()
    return None


@hookimpl
def save_state(
    output_dir: str,
    accelerator: Any,
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
    accelerator: Any,
    models: list,
    optimizers: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
) -> bool:
    from drivetrain_fsdp import checkpoint

    checkpoint.load(input_dir, accelerator, models, optimizers, schedulers, map_location, load_kwargs)
    return True
