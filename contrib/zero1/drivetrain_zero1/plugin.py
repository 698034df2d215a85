"""The zero1 backend: one model replica per process (DDP), the optimizer state sharded across the processes
(``torch.distributed.optim.ZeroRedundancyOptimizer``, ZeRO stage 1).

Written from docs/plugins/tutorial.md alone, as a third-party author would; docs/plugins/tutorial.md lists
what the docs lacked. Select it with ``Accelerator(backend="zero1")`` or ``--backend zero1``.
"""

from __future__ import annotations

import inspect
import os
import weakref
from typing import Any

import torch
import torch.distributed as dist

from drivetrain import hookimpl
from drivetrain.plugin_api import (
    Capabilities,
    DistributedEnvironment,
    DistributedType,
    PluginInfo,
    TorchCollectives,
)

PLUGIN_INFO = PluginInfo(
    kind="backend",
    contract="1.1",
    description="data parallel with the optimizer state sharded across processes (ZeRO stage 1)",
    capabilities=Capabilities(
        multi_process=True,
        # Each process keeps the optimizer state of its share of the parameters only...
        sharded_state=True,
        # ...but save_state consolidates it, so checkpoints are the reference format.
        portable_checkpoints=True,
        precisions=("no", "bf16", "fp16"),
        devices=("cpu", "cuda"),
    ),
)

#: DDP wrappers built in this process: released before the process group is destroyed (see _shutdown).
_wrappers: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def _shutdown() -> None:
    """Meet the other ranks, drop every DDP reducer (it holds the process group), destroy the group."""
    if not dist.is_initialized():
        return
    dist.barrier()
    for wrapper in list(_wrappers):
        wrapper.__dict__["reducer"] = None
        wrapper.__dict__["logger"] = None
    _wrappers.clear()
    dist.destroy_process_group()


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> DistributedEnvironment:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistributedEnvironment(distributed_type=DistributedType.NO)
    if not dist.is_initialized():
        backend = init_kwargs.get("backend") or ("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, rank=int(os.environ["RANK"]), world_size=world_size)
    return DistributedEnvironment(
        num_processes=dist.get_world_size(),
        process_index=dist.get_rank(),
        local_process_index=int(os.environ.get("LOCAL_RANK", "0")),
        local_num_processes=int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size))),
        distributed_type=DistributedType.MULTI_GPU if device.type == "cuda" else DistributedType.MULTI_CPU,
        torch_backend=dist.get_backend(),
        collectives=TorchCollectives(),
        shutdown=_shutdown,
    )


@hookimpl
def wrap_model(model: torch.nn.Module, accelerator: Any, evaluation_mode: bool) -> torch.nn.Module | None:
    if evaluation_mode or accelerator.num_processes == 1:
        return None
    device = accelerator.device
    wrapped = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    _wrappers.add(wrapped)
    return wrapped


@hookimpl
def wrap_optimizer(optimizer: torch.optim.Optimizer, accelerator: Any) -> torch.optim.Optimizer | None:
    """Replace the user's optimizer by a ZeroRedundancyOptimizer of the same class and settings. The kernel
    rebinds the user's LR schedulers to the returned optimizer (plugin_api.rebind_scheduler); ZeRO copies
    the learning rate of its own param_groups into the shard's optimizer on every step, so they follow."""
    # Imported here: torch.distributed.optim pulls in sympy (about 600 modules), and the plugin module is
    # imported whenever the kernel lists plugins, in runs that never use this backend.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if accelerator.num_processes == 1 or isinstance(optimizer, ZeroRedundancyOptimizer):
        return None
    groups = [dict(group) for group in optimizer.param_groups]  # per-group settings (lr, weight decay) kept
    # ``defaults`` may hold keys the class's constructor does not take (AdamW: decoupled_weight_decay).
    accepted = inspect.signature(type(optimizer).__init__).parameters
    defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted}
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)


@hookimpl
def save_state(accelerator: Any, optimizers: list) -> None:
    """Gather every ZeRO optimizer's shards on the process that writes the checkpoint, then return None:
    the reference backend writes the files (optimizer.state_dict() is the whole state there)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    writer = 0  # drivetrain writes shared checkpoint files from the main process
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        if isinstance(inner, ZeroRedundancyOptimizer):
            inner.consolidate_state_dict(to=writer)
    return None
