"""The ddp plugin's hook implementations: join the process group, wrap models in DistributedDataParallel.

The kernel's ``no_sync``, ``trigger_sync_in_backward`` and ``join_uneven_inputs`` work on the wrapped
model by duck typing: :class:`~drivetrain_ddp.wrapper.DrivetrainDDP` provides ``no_sync()`` and
``trigger_sync_in_backward()`` and is a torch ``Joinable``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import (
    Capabilities,
    DistributedEnvironment,
    ParallelismConfig,
    PluginAccelerator,
    PluginInfo,
    join_process_group,
    wrap_data_parallel,
)
from drivetrain_ddp.wrapper import DrivetrainDDP

PLUGIN_INFO = PluginInfo(
    kind="backend",
    description="torch DistributedDataParallel: one model replica per process, gradients all-reduced",
    capabilities=Capabilities(
        multi_process=True,
        precisions=("no", "bf16", "fp16"),
        devices=("cpu", "cuda", "xpu"),
        # Plain data parallelism: a ParallelismConfig may only replicate (tp/cp/sharding: the fsdp backend).
        mesh_dimensions=("dp_replicate",),
        # Every rank holds the whole state; rank 0 writes it in the reference format.
        portable_checkpoints=True,
        # Every prepared model is a DrivetrainDDP, a torch Joinable: join_uneven_inputs runs under Join.
        joinable=True,
    ),
    select_for_multiprocess=True,
)


@hookimpl
def setup_process_group(
    device: torch.device, init_kwargs: dict[str, Any], parallelism: ParallelismConfig | None
) -> DistributedEnvironment:
    environment = join_process_group(device, init_kwargs)
    if (
        parallelism is None
        or parallelism.total_size != environment.num_processes
        or environment.num_processes == 1
    ):
        return environment  # the kernel reports a size mismatch, naming both values
    # dp_replicate over every process: the same shares as without a config, and the mesh scripts may ask for.
    return dataclasses.replace(environment, device_mesh=parallelism.build_device_mesh(device.type))


def ddp_kwargs_handler(accelerator: PluginAccelerator) -> Any:
    """The user's ``DistributedDataParallelKwargs`` from ``Accelerator(kwargs_handlers=[...])``, or None."""
    from drivetrain_ddp.config import DistributedDataParallelKwargs

    for handler in getattr(accelerator, "kwargs_handlers", ()):
        if isinstance(handler, DistributedDataParallelKwargs):
            return handler
    return None


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    handler = ddp_kwargs_handler(accelerator)
    kwargs = handler.to_kwargs() if handler is not None else {}
    wrapped = wrap_data_parallel(model, accelerator, evaluation_mode, wrapper=DrivetrainDDP, **kwargs)
    if wrapped is not None and handler is not None:
        handler.register_comm_hook(wrapped)
    return wrapped
