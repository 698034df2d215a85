"""The process group (``plugin_api.join_process_group``) and megatron-core's tensor/pipeline/data-parallel
groups (``parallel_state.initialize_model_parallel``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from drivetrain.plugin_api import (
    ConfigurationError,
    DistributedEnvironment,
    DistributedType,
    join_process_group,
    shutdown_process_group,
)
from drivetrain_megatron.config import MegatronLMPlugin
from drivetrain_megatron.schedule import cuda_device_calls_resolve


def shutdown() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    shutdown_process_group()


def check_degrees(config: MegatronLMPlugin, world_size: int, device: torch.device) -> None:
    """Degrees that cannot be laid out on ``world_size`` processes of ``device``, with what would run."""
    model_parallel = config.tp_degree * config.pp_degree
    if world_size % model_parallel:
        raise ConfigurationError(
            f"MegatronLMPlugin: tp_degree x pp_degree = {config.tp_degree} x {config.pp_degree} = "
            f"{model_parallel} must divide the number of processes ({world_size})"
        )
    if device.type == "cuda" or cuda_device_calls_resolve():
        return
    needs = []
    if config.pp_degree > 1 or config.num_micro_batches > 1:
        needs.append(
            f"pp_degree={config.pp_degree} / num_micro_batches={config.num_micro_batches} (megatron-core's "
            "schedules allocate on 'cuda' and torch.cuda.current_device())"
        )
    if config.sequence_parallelism:
        needs.append(
            "sequence_parallelism=True (its all-gather and reduce-scatter allocate on torch.cuda.current_device())"
        )
    if needs:
        raise ConfigurationError(
            f"MegatronLMPlugin: {'; '.join(needs)} need CUDA, and this torch has none (the process computes on "
            f"{device.type}); use pp_degree=1, num_micro_batches=1 and sequence_parallelism=False here (tensor "
            "and data parallelism run on CPU)"
        )


def join(
    device: torch.device, init_kwargs: dict[str, Any], config: MegatronLMPlugin
) -> DistributedEnvironment:
    """``setup_process_group`` of the megatron backend: the torchrun process group, then megatron-core's
    groups; data is shared out by data-parallel rank (every tensor/pipeline-parallel peer sees the same batch)."""
    from megatron.core import parallel_state

    environment = join_process_group(device, init_kwargs, alone=True)
    world_size = environment.num_processes
    check_degrees(config, world_size, device)
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=config.tp_degree,
        pipeline_model_parallel_size=config.pp_degree,
        virtual_pipeline_model_parallel_size=_virtual_stages(config),
    )
    return dataclasses.replace(
        environment,
        distributed_type=DistributedType.MEGATRON_LM,
        shutdown=shutdown,
        data_parallel_size=parallel_state.get_data_parallel_world_size(),
        data_parallel_rank=parallel_state.get_data_parallel_rank(),
    )


def _virtual_stages(config: MegatronLMPlugin) -> int | None:
    if config.num_layers_per_virtual_pipeline_stage is None or config.pp_degree == 1:
        return None
    layers = (config.other_megatron_args or {}).get("num_layers")
    if layers is None:
        raise ConfigurationError(
            "MegatronLMPlugin.num_layers_per_virtual_pipeline_stage needs the model's layer count: pass "
            "other_megatron_args={'num_layers': N}"
        )
    return int(layers) // config.pp_degree // config.num_layers_per_virtual_pipeline_stage


def data_parallel_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_world_size()


def data_parallel_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


def layout() -> dict[str, int]:
    """This process's coordinates and the degrees, as written into checkpoints."""
    from megatron.core import parallel_state as ps

    return {
        "tp_degree": ps.get_tensor_model_parallel_world_size(),
        "pp_degree": ps.get_pipeline_model_parallel_world_size(),
        "dp_degree": ps.get_data_parallel_world_size(),
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "dp_rank": ps.get_data_parallel_rank(),
    }
