"""The megatron plugin's hook implementations: megatron-core's tensor/pipeline/data-parallel groups, data
shared out over the data-parallel group only, gradients synchronised over it, model-parallel checkpoints.

See docs/megatron.md for the user's view. Nothing here imports megatron-core at module level, so listing
plugins and parsing ``drivetrain launch`` flags stay fast.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, DistributedType, PluginAccelerator, PluginInfo
from drivetrain_megatron.config import MegatronLMPlugin, resolve_config

PLUGIN_INFO = PluginInfo(
    kind="backend",
    # megatron-core's package; find_spec of "megatron.core" would import "megatron" to look inside it.
    requires=("megatron",),
    description="megatron-core: tensor, sequence and pipeline parallelism with data parallelism over the rest",
    capabilities=Capabilities(
        multi_process=True,
        # Only megatron-core's tensor-parallel layers are sharded, by the layers themselves, and only when
        # tp_degree > 1: with the defaults, or for plain torch modules, every process holds the whole model
        # and optimizer state (the conformance suite checks this declaration against what processes hold).
        sharded_state=False,
        precisions=("no", "bf16"),
        devices=("cpu", "cuda"),
        # The degrees come from MegatronLMPlugin; a ParallelismConfig is not read.
        mesh_dimensions=(),
        # Its optimizer step clips by MegatronLMPlugin.gradient_clipping, 1.0 unless set (0: off), as in
        # Accelerate.
        clipping_setting="gradient_clipping",
    ),
    distributed_type="MEGATRON_LM",
    config_section="megatron_lm_config",
    launch_flag="use_megatron_lm",
)


def active_config(accelerator: PluginAccelerator) -> MegatronLMPlugin:
    """The configuration of the Accelerator's run (resolved once per run: backward asks for it every step)."""
    return resolve_config(accelerator.state.backend_config)


def _state_megatron_lm_plugin(state: Any) -> MegatronLMPlugin | None:
    """``AcceleratorState().megatron_lm_plugin``: the active configuration in a megatron run, else None."""
    if getattr(state, "distributed_type", None) != DistributedType.MEGATRON_LM:
        return None
    return resolve_config(state.backend_config)


@hookimpl
def register_extensions(registry: Any) -> None:
    from drivetrain_megatron.launch_options import add_arguments

    registry.add_launch_options(add_arguments)
    registry.add_state_attribute("megatron_lm_plugin", _state_megatron_lm_plugin, on_accelerator=False)


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any], backend_config: Any) -> Any:
    from drivetrain_megatron.process_group import join

    return join(device, init_kwargs, resolve_config(backend_config))


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    from drivetrain_megatron.training import wrap_for_data_parallel

    return wrap_for_data_parallel(model, accelerator, active_config(accelerator), evaluation_mode)


@hookimpl
def shard_dataloader(dataloader: Any, accelerator: PluginAccelerator, options: Any) -> Any:
    from drivetrain_megatron.dummies import MegatronLMDummyDataLoader
    from drivetrain_megatron.training import record_batch_sizes

    if isinstance(dataloader, MegatronLMDummyDataLoader):
        return dataloader.build(accelerator, active_config(accelerator), options)
    record_batch_sizes(dataloader, active_config(accelerator), options)
    return None  # the reference sharding, by the environment's data-parallel size and rank


@hookimpl
def wrap_optimizer(
    optimizer: torch.optim.Optimizer, accelerator: PluginAccelerator
) -> torch.optim.Optimizer | None:
    from drivetrain_megatron.training import prepare_optimizer

    return prepare_optimizer(optimizer, accelerator, active_config(accelerator))


@hookimpl
def backward(loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]) -> bool:
    from drivetrain_megatron.training import run_backward

    run_backward(loss, accelerator, backward_kwargs, active_config(accelerator))
    return True


@hookimpl
def clip_grad_norm(
    parameters: list, max_norm: float, norm_type: float, accelerator: PluginAccelerator
) -> torch.Tensor | None:
    from drivetrain_megatron.training import clip_grad_norm as clip

    return clip(parameters, max_norm, norm_type)


@hookimpl
def save_state(
    output_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
) -> bool:
    from drivetrain_megatron import checkpoint

    checkpoint.save(output_dir, accelerator, models, optimizers, schedulers, active_config(accelerator))
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
    verified: Any,
) -> bool:
    from drivetrain_megatron import checkpoint

    checkpoint.load(
        input_dir,
        accelerator,
        models,
        optimizers,
        schedulers,
        map_location,
        load_kwargs,
        verified,
        active_config(accelerator),
    )
    return True
