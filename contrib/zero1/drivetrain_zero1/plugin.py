"""The zero1 backend: one model replica per process (DDP), the optimizer state sharded across the processes
(``torch.distributed.optim.ZeroRedundancyOptimizer``, ZeRO stage 1).

Written from docs/plugins/tutorial.md alone, as a third-party author would; docs/plugins/tutorial.md lists
what the docs lacked. Select it with ``Accelerator(backend="zero1")`` or ``--backend zero1``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

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
    description="data parallel with the optimizer state sharded across processes (ZeRO stage 1)",
    capabilities=Capabilities(
        multi_process=True,
        # Each process keeps the optimizer state of its share of the parameters only...
        sharded_state=True,
        # ...but save_state consolidates it, so checkpoints are the reference format.
        portable_checkpoints=True,
        precisions=("no", "bf16", "fp16"),
        devices=("cpu", "cuda"),
        # Its models are torch's DistributedDataParallel (a Joinable): join_uneven_inputs runs under Join.
        joinable=True,
    ),
)


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> DistributedEnvironment:
    return join_process_group(device, init_kwargs)


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    return wrap_data_parallel(model, accelerator, evaluation_mode)


@hookimpl
def wrap_optimizer(
    optimizer: torch.optim.Optimizer, accelerator: PluginAccelerator
) -> torch.optim.Optimizer | None:
    """Replace the user's optimizer by a ZeroRedundancyOptimizer of the same class and settings. The kernel
    rebinds the user's LR schedulers to the returned optimizer (plugin_api.training.rebind_scheduler); ZeRO copies
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
def save_state(accelerator: PluginAccelerator, optimizers: list) -> None:
    """Gather every ZeRO optimizer's shards on the process that writes the checkpoint, then return None:
    the reference backend writes the files (optimizer.state_dict() is the whole state there)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    writer = 0  # drivetrain writes shared checkpoint files from the main process
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        if isinstance(inner, ZeroRedundancyOptimizer):
            inner.consolidate_state_dict(to=writer)
    return None
