"""Joining the process group through the kernel's ``join_process_group``, then handing it to DeepSpeed.

The kernel joins the group (the launcher's variables, its restart-safe store, NCCL's ``device_id``, the exit
handler and its barrier timeout) and DeepSpeed adopts it: ``deepspeed.init_distributed`` on an initialised
group only records it. Works under torch's launcher (``drivetrain launch``/torchrun), DeepSpeed's own launcher
(both set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT) and in a single process, where a group of one is
formed all the same so that one-process runs get a real engine too.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from drivetrain.plugin_api import DistributedEnvironment, DistributedType
from drivetrain.plugin_api import join_process_group as join_torch_process_group
from drivetrain.plugin_api import shutdown_process_group as shutdown_torch_process_group
from drivetrain_deepspeed.library import import_deepspeed


def _single_process_defaults() -> None:
    """DeepSpeed reads ``LOCAL_RANK`` (and its launcher's other variables) from the environment, also in one
    process: the variables of a run of one, when nothing launched this one."""
    if os.environ.get("WORLD_SIZE"):
        return
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})


def shutdown_process_group() -> None:
    """Meet the other ranks, destroy the process group (idempotent), and forget DeepSpeed's groups."""
    shutdown_torch_process_group()
    _forget_deepspeed_groups()


def _forget_deepspeed_groups() -> None:
    """DeepSpeed caches its communication backend and the groups it derived from the process group; after
    the group is destroyed they are stale, so a later Accelerator in this process (after
    ``drivetrain.reset_state(destroy_process_group=True)``) must start from scratch."""
    import sys

    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None:
        setattr(comm, "cdb", None)  # noqa: B010 (deepspeed.comm's module-level backend)
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None:
        for name, value in list(vars(groups).items()):
            if name.startswith("_") and name.isupper() and not name.startswith("__"):
                if isinstance(value, dict):
                    setattr(groups, name, {})
                elif value is not None and not isinstance(value, (int, str, float, bool)):
                    setattr(groups, name, None)


def join_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> DistributedEnvironment:
    _single_process_defaults()
    deepspeed = import_deepspeed(device.type)
    from deepspeed.constants import default_pg_timeout

    # DeepSpeed's default timeout (DEEPSPEED_TIMEOUT minutes) when the script set none, as under Accelerate.
    environment = join_torch_process_group(device, {"timeout": default_pg_timeout, **init_kwargs}, alone=True)
    deepspeed.init_distributed(dist_backend=environment.torch_backend, auto_mpi_discovery=False)
    # An Accelerator is being created: transformers, when the script uses it, must see its active plugin
    # before the script builds a model (from_pretrained under ZeRO-3 creates it partitioned).
    from drivetrain_deepspeed.transformers_link import keep_transformers_current

    keep_transformers_current()
    return dataclasses.replace(
        environment, distributed_type=DistributedType.DEEPSPEED, shutdown=shutdown_process_group
    )
