"""The process group (``plugin_api.join_process_group``) and the device mesh FSDP2 shards over."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from drivetrain.plugin_api import (
    ConfigurationError,
    DistributedEnvironment,
    DistributedType,
    PluginAccelerator,
    join_process_group,
    shutdown_process_group,
)
from drivetrain_fsdp.config import FullyShardedDataParallelPlugin, ShardingStrategy

#: Meshes built in this process, by (device type, shape); dropped when the process group goes away.
_meshes: dict[tuple[str, tuple[int, ...]], Any] = {}


def shutdown() -> None:
    _meshes.clear()
    shutdown_process_group()


def join(
    device: torch.device, init_kwargs: dict[str, Any], parallelism: Any = None
) -> DistributedEnvironment:
    """``setup_process_group`` of the fsdp backend: the kernel's ``join_process_group``, in a group of one
    too (so that fully_shard and torch.distributed.checkpoint work unchanged in a single process, and a
    checkpoint saved by one process reshards onto many, and back), reported as ``DistributedType.FSDP``; with
    a ``ParallelismConfig``, also the run's N-D mesh, this process's data-parallel coordinates and (with a
    ``cp`` dimension) the context-parallel context."""
    environment = dataclasses.replace(
        join_process_group(device, init_kwargs, alone=True),
        distributed_type=DistributedType.FSDP,
        shutdown=shutdown,
    )
    if parallelism is None or parallelism.total_size != environment.num_processes:
        return environment  # the kernel reports a size mismatch, naming both values
    mesh = parallelism.build_device_mesh(device.type)
    if mesh is None:
        return environment
    context = None
    if parallelism.cp_enabled:
        from drivetrain_fsdp.context_parallel import context_parallel_factory

        context = context_parallel_factory(mesh, parallelism.cp_handler)
    return dataclasses.replace(
        environment,
        device_mesh=mesh,
        data_parallel_size=parallelism.data_parallel_size,
        data_parallel_rank=parallelism.submesh(mesh, "dp").get_local_rank()
        if parallelism.dp_dim_names
        else 0,
        context_parallel=context,
    )


def mesh_shape(
    config: FullyShardedDataParallelPlugin, world_size: int, local_world_size: int
) -> tuple[int, ...]:
    """(shard,) for FULL_SHARD / SHARD_GRAD_OP; (replicate, shard) for the hybrid strategies and NO_SHARD
    (a shard group of one: every rank holds everything, gradients are all-reduced as in DDP)."""
    if config.sharding_strategy == ShardingStrategy.NO_SHARD:
        return (world_size, 1)
    if not config.is_hybrid:
        return (world_size,)
    shard = config.hybrid_shard_size or local_world_size
    if shard > world_size or world_size % shard:
        raise ConfigurationError(
            f"FullyShardedDataParallelPlugin.hybrid_shard_size={shard} must divide the number of processes "
            f"({world_size}); by default it is the number of processes per machine"
        )
    return (world_size // shard, shard)


def device_mesh(config: FullyShardedDataParallelPlugin, accelerator: PluginAccelerator) -> Any:
    """The DeviceMesh a model is sharded over (built once per shape; every rank builds it in the same order)."""
    from torch.distributed.device_mesh import init_device_mesh

    environment = accelerator.state.partial_state.environment
    shape = mesh_shape(config, accelerator.num_processes, environment.local_num_processes)
    key = (accelerator.device.type, shape)
    if key not in _meshes:
        names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
        _meshes[key] = init_device_mesh(accelerator.device.type, shape, mesh_dim_names=names)
    return _meshes[key]
