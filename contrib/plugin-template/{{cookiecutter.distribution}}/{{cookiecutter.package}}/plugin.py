"""The backend's hook implementations.

As rendered, this is a working data-parallel backend (torch DistributedDataParallel over gloo or nccl) that
passes the conformance suite with one and with several processes: change it from here. ``backward`` runs the
reference backward where your backend's own step would follow it; every other hook is stubbed to return
``None``, which means "not mine": drivetrain then asks the next plugin and finally the reference backend
``local``. A hook may also do a side effect and return ``None`` to reuse the reference
behaviour after it (``save_state`` consolidating a sharded optimizer, then letting ``local`` write the files).
Replace a stub where your backend differs; delete the ones you never need. The full contract, with each
hook's arguments and calling rule, is docs/hooks.md; everything else a plugin may import from drivetrain is
``drivetrain.plugin_api`` (docs/plugins/api.md). An implementation may take any subset of a hook's arguments.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import (
    Capabilities,
    DistributedEnvironment,
    PluginAccelerator,
    PluginInfo,
    ShardingOptions,
    join_process_group,
    wrap_data_parallel,
)
from drivetrain.plugin_api.training import reference_backward

PLUGIN_INFO = PluginInfo(
    kind="backend",
    # The contract version this plugin implements; drivetrain refuses a different major version.
    contract="1.3",
    description="{{ cookiecutter.description }}",
    # What the conformance suite holds you to; properties outside these are reported "n/a".
    capabilities=Capabilities(
        multi_process=True,
        # True once a process holds only part of the model or optimizer state (the suite checks it).
        sharded_state=False,
        # The reference backend's checkpoint files are written and read (save_state/load_state return None).
        portable_checkpoints=True,
        precisions=("no", "bf16", "fp16"),
        devices=("cpu", "cuda"),
        # Every prepared model is a torch Joinable (DistributedDataParallel), so accelerator.join_uneven_inputs
        # runs its block under torch's Join; set False if wrap_model returns anything else (the suite checks).
        joinable=True,
    ),
    # Third-party libraries to import lazily (``drivetrain plugins`` reports when they do not import).
    requires=(),
)


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> DistributedEnvironment:
    """Join the process group; return a ``DistributedEnvironment`` (ranks, world size, distributed type,
    collectives, shutdown). ``init_kwargs`` holds the script's ``InitProcessGroupKwargs`` (``backend``,
    ``init_method``, ``timeout``) that are not None. ``join_process_group`` joins the group the launcher
    describes (gloo on CPU, nccl on CUDA), shuts it down at ``accelerator.end_training()`` or at exit, and
    releases what ``wrap_data_parallel`` built first; ``dataclasses.replace`` its result to change what it
    reports."""
    return join_process_group(device, init_kwargs)


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    """Wrap or convert a model for training (chain: return the new model, or ``None`` for unchanged). The
    wrapper's ``no_sync()`` is what the kernel enters between gradient accumulation boundaries, and
    ``accelerator.unwrap_model`` finds the user's module inside whatever you return (the kernel records it).
    ``wrap_data_parallel`` is torch's DistributedDataParallel (``None`` where there is nothing to wrap)."""
    return wrap_data_parallel(model, accelerator, evaluation_mode)


@hookimpl
def wrap_optimizer(
    optimizer: torch.optim.Optimizer, accelerator: PluginAccelerator
) -> torch.optim.Optimizer | None:
    """Rebind or replace an optimizer (chain). ``None``: unchanged. When you return another optimizer, the
    kernel rebinds the user's LR schedulers to it (``plugin_api.training.rebind_scheduler``): its ``param_groups``
    must be the ones its ``step()`` uses."""
    return None


@hookimpl
def shard_dataloader(
    dataloader: Any, accelerator: PluginAccelerator, device_placement: bool, options: ShardingOptions
) -> Any:
    """Return a loader yielding this process's share of every batch. ``None``: drivetrain's reference
    sharding (all data loader modes)."""
    return None


@hookimpl
def autocast(
    accelerator: PluginAccelerator, autocast_kwargs: dict[str, Any]
) -> contextlib.AbstractContextManager | None:
    """The context forward passes run under for ``accelerator.mixed_precision``. ``None``: torch.autocast."""
    return None


@hookimpl
def backward(
    loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]
) -> bool | None:
    """Run the backward pass and return True (``None``: the reference backward). ``reference_backward`` is the
    reference: the loss scaled by the fp16 GradScaler, then ``loss.backward(**backward_kwargs)``. Add your
    backend's own step after it; gradients must be synchronised by the end of a backward where
    ``accelerator.sync_gradients`` is true, because clipping reads them next (DistributedDataParallel does it
    inside ``loss.backward()``)."""
    reference_backward(loss, accelerator, backward_kwargs)
    return True


@hookimpl
def clip_grad_norm(
    parameters: list, max_norm: float, norm_type: float, accelerator: PluginAccelerator
) -> torch.Tensor | None:
    """Clip by the global norm and return it. ``None``: torch.nn.utils.clip_grad_norm_."""
    return None


@hookimpl
def save_state(
    output_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    weights: list,
    optimizers: list,
    schedulers: list,
    safe_serialization: bool,
    save_kwargs: dict[str, Any],
) -> bool | None:
    """Write models, optimizers, schedulers into ``output_dir`` and return True. ``None``: drivetrain's files."""
    return None


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
) -> bool | None:
    """Restore what save_state wrote and return True. ``None``: drivetrain's files."""
    return None
