"""The bf16-ddp backend: one model replica per process; under ``mixed_precision="bf16"`` gradients travel
as bfloat16 (half the bytes of fp32) and are averaged back in fp32.

Select it with ``Accelerator(backend="bf16-ddp")`` or ``DRIVETRAIN_BACKEND=bf16-ddp``; it is not picked
automatically for multi-process runs (``select_for_multiprocess`` stays False) so it never competes with
the ddp backend.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from drivetrain import hookimpl
from drivetrain.plugin_api import (
    Capabilities,
    DistributedEnvironment,
    PluginAccelerator,
    PluginInfo,
    join_process_group,
    wrap_data_parallel,
)

PLUGIN_INFO = PluginInfo(
    kind="backend",
    contract="1.3",
    description="data parallel; all-reduces bf16-compressed gradients under mixed_precision='bf16'",
    capabilities=Capabilities(
        multi_process=True,
        precisions=("no", "bf16"),
        devices=("cpu", "cuda"),
        portable_checkpoints=True,
        # Its models are torch's DistributedDataParallel (a Joinable): join_uneven_inputs runs under Join.
        joinable=True,
    ),
)


def bf16_compressed_allreduce(process_group, bucket):  # torch checks a hook's annotations: leave them off
    """DDP communication hook: average a gradient bucket over the processes, sent as bfloat16.

    torch ships ``bf16_compress_hook``, but it refuses gloo (CPU); this one runs on every torch.distributed
    backend that reduces bfloat16.
    """
    group = process_group if process_group is not None else dist.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size(group))

    def decompress(future):
        buffer = bucket.buffer()
        buffer.copy_(future.value()[0])
        return buffer

    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> DistributedEnvironment:
    return join_process_group(device, init_kwargs)


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    wrapped = wrap_data_parallel(model, accelerator, evaluation_mode)
    if wrapped is not None and accelerator.mixed_precision == "bf16":
        wrapped.register_comm_hook(None, bf16_compressed_allreduce)
    return wrapped
