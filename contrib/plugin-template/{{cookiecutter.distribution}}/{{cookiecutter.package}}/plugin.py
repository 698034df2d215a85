"""The backend's hook implementations.

Every hook below is stubbed to return ``None``, which means "not mine": drivetrain then asks the next plugin
and finally the reference backend ``local``. Replace a stub where your backend differs; delete the ones you
never need. The full contract, with each hook's arguments and calling rule, is docs/hooks.md; everything
else a plugin may import from drivetrain is ``drivetrain.plugin_api`` (docs/plugins/api.md). An
implementation may take any subset of a hook's arguments.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, PluginInfo

PLUGIN_INFO = PluginInfo(
    kind="backend",
    # The contract version this plugin implements; drivetrain refuses a different major version.
    contract="1.1",
    description="{{ cookiecutter.description }}",
    # What the conformance suite holds you to; properties outside these are reported "n/a".
    # Set multi_process=True once setup_process_group and wrap_model handle several processes.
    capabilities=Capabilities(
        multi_process=False, sharded_state=False, precisions=("no", "bf16", "fp16"), devices=("cpu",)
    ),
    # Third-party libraries to import lazily (``drivetrain plugins`` reports when they do not import).
    requires=(),
)


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any], parallelism: Any) -> Any:
    """Join the process group; return a ``plugin_api.DistributedEnvironment`` (ranks, world size,
    distributed type, collectives, shutdown). ``None``: one process, like ``local``."""
    return None


@hookimpl
def wrap_model(model: torch.nn.Module, accelerator: Any, evaluation_mode: bool) -> torch.nn.Module | None:
    """Wrap or convert a model for training (chain: return the new model, or ``None`` for unchanged). Give a
    wrapper ``no_sync()`` if gradient synchronisation can be skipped."""
    return None


@hookimpl
def wrap_optimizer(optimizer: torch.optim.Optimizer, accelerator: Any) -> torch.optim.Optimizer | None:
    """Rebind or replace an optimizer (chain). ``None``: unchanged."""
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
