"""Joining the process group through ``deepspeed.init_distributed`` (gloo on the CPU).

Works under torch's launcher (``drivetrain launch``/torchrun), DeepSpeed's own launcher (both set
RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT) and in a single process, where the variables are filled
in so that one-process runs get a real engine too.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import torch

from drivetrain.plugin_api import DistributedEnvironment, DistributedType, TorchCollectives
from drivetrain_deepspeed.library import import_deepspeed

TORCH_BACKEND_FOR_DEVICE = {"cuda": "nccl", "xpu": "xccl", "cpu": "gloo"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _single_process_defaults() -> None:
    if os.environ.get("WORLD_SIZE"):
        return
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def shutdown_process_group() -> None:
    """Meet the other ranks, then destroy the process group (idempotent)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    _forget_deepspeed_groups()


def _forget_deepspeed_groups() -> None:
    """DeepSpeed caches its communication backend and the groups it derived from the process group; after
    the group is destroyed they are stale, so a later Accelerator in this process (after
    ``drivetrain.reset_state(destroy_process_group=True)``) must start from scratch."""
    import sys

    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None:
        comm.cdb = None
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None:
        for name, value in list(vars(groups).items()):
            if name.startswith("_") and name.isupper() and not name.startswith("__"):
                if isinstance(value, dict):
                    setattr(groups, name, {})
                elif value is not None and not isinstance(value, (int, str, float, bool)):
                    setattr(groups, name, None)


def join_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> DistributedEnvironment:
    import torch.distributed as dist

    _single_process_defaults()
    deepspeed = import_deepspeed(device.type)
    kwargs = dict(init_kwargs)
    backend = kwargs.pop("backend", None) or TORCH_BACKEND_FOR_DEVICE.get(device.type, "gloo")
    timeout = kwargs.pop("timeout", None)
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        extra = {"timeout": timeout} if timeout is not None else {}
        deepspeed.init_distributed(
            dist_backend=backend, auto_mpi_discovery=False, dist_init_required=True, **extra
        )
    # An Accelerator is being created: transformers, when the script uses it, must see its active plugin
    # before the script builds a model (from_pretrained under ZeRO-3 creates it partitioned).
    from drivetrain_deepspeed.transformers_link import keep_transformers_current

    keep_transformers_current()
    return DistributedEnvironment(
        num_processes=dist.get_world_size(),
        process_index=dist.get_rank(),
        local_process_index=int(os.environ.get("LOCAL_RANK", "0")),
        local_num_processes=int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.get_world_size()))),
        distributed_type=DistributedType.DEEPSPEED,
        torch_backend=dist.get_backend(),
        collectives=TorchCollectives(),
        shutdown=shutdown_process_group,
    )
