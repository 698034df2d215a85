"""The backend's hook implementations.

As rendered, this is a working data-parallel backend (torch DistributedDataParallel over gloo or nccl) that
passes the conformance suite with one and with several processes: change it from here. Every other hook is
stubbed to return ``None``, which means "not mine": drivetrain then asks the next plugin and finally the
reference backend ``local``. A hook may also do a side effect and return ``None`` to reuse the reference
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
    PluginInfo,
    join_process_group,
    release_at_shutdown,
)

PLUGIN_INFO = PluginInfo(
    kind="backend",
    # The contract version this plugin implements; drivetrain refuses a different major version.
    contract="1.1",
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
    ),
    # Third-party libraries to import lazily (``drivetrain plugins`` reports when they do not import).
    requires=(),
)


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> Any:
    """Join the process group; return a ``plugin_api.DistributedEnvironment`` (ranks, world size,
    distributed type, collectives, shutdown). ``init_kwargs`` holds the script's
    ``InitProcessGroupKwargs`` (``backend``, ``init_method``, ``timeout``) that are not None.
    ``join_process_group`` joins the group the launcher describes (gloo on CPU, nccl on CUDA) and shuts it
    down at ``accelerator.end_training()``; ``dataclasses.replace`` its result to change what it reports."""
    return join_process_group(device, init_kwargs)


@hookimpl
def wrap_model(model: torch.nn.Module, accelerator: Any, evaluation_mode: bool) -> torch.nn.Module | None:
    """Wrap or convert a model for training (chain: return the new model, or ``None`` for unchanged). The
    wrapper's ``no_sync()`` is what the kernel enters between gradient accumulation boundaries."""
    if evaluation_mode or accelerator.num_processes == 1:
        return None
    device = accelerator.device
    wrapped = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    return release_at_shutdown(wrapped)


@hookimpl
def wrap_optimizer(optimizer: torch.optim.Optimizer, accelerator: Any) -> torch.optim.Optimizer | None:
    """Rebind or replace an optimizer (chain). ``None``: unchanged. When you return another optimizer, the
    kernel rebinds the user's LR schedulers to it (``plugin_api.rebind_scheduler``): its ``param_groups``
    must be the ones its ``step()`` uses."""
    return None


@hookimpl
def shard_dataloader(dataloader: Any, accelerator: Any, device_placement: bool, options: Any) -> Any:
    """Return a loader yielding this process's share of every batch (``options`` is a
    ``plugin_api.ShardingOptions``). ``None``: drivetrain's reference sharding (all data loader modes)."""
    return None


@hookimpl
def autocast(accelerator: Any, autocast_kwargs: dict[str, Any]) -> contextlib.AbstractContextManager | None:
    """The context forward passes run under for ``accelerator.mixed_precision``. ``None``: torch.autocast."""
    return None


@hookimpl
def backward(loss: torch.Tensor, accelerator: Any, backward_kwargs: dict[str, Any]) -> bool | None:
    """Run the backward pass and return True. ``None``: ``loss.backward()`` (with the fp16 GradScaler)."""
    return None


@hookimpl
def clip_grad_norm(
    parameters: list, max_norm: float, norm_type: float, accelerator: Any
) -> torch.Tensor | None:
    """Clip by the global norm and return it. ``None``: torch.nn.utils.clip_grad_norm_."""
    return None


@hookimpl
def save_state(
    output_dir: str,
    accelerator: Any,
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
    accelerator: Any,
    models: list,
    optimizers: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
    verified: Any,
) -> bool | None:
    """Restore what save_state wrote and return True. ``None``: drivetrain's files."""
    return None
