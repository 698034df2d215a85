"""flat-dp: data parallelism without torch's DistributedDataParallel, written from the plugin docs alone.

The model is wrapped in a plain module that broadcasts process 0's parameters and buffers when it wraps;
gradients are averaged by one flat all-reduce at the end of every synchronised backward; ``no_sync()``
keeps them local for gradient accumulation. Everything else (data sharding, autocast, clipping, checkpoints)
is the reference backend's: those hooks are not implemented here. How it was written, and what the docs
had to say for it, is in README.md beside this file.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, PluginAccelerator, PluginInfo, join_process_group
from drivetrain.plugin_api.training import reference_backward

PLUGIN_INFO = PluginInfo(
    kind="backend",
    contract="1.2",
    description="data parallel: broadcast at wrap, one flat all-reduce per synchronised backward",
    capabilities=Capabilities(
        multi_process=True,
        sharded_state=False,
        portable_checkpoints=True,
        precisions=("no", "bf16", "fp16"),
        devices=("cpu", "cuda"),
    ),
    # distributed_type stays None: it only maps Accelerate's config-file value (distributed_type: FSDP, ...)
    # to a backend; what a script reads (accelerator.distributed_type) comes from setup_process_group.
)


def declaring(*precisions: str) -> PluginInfo:
    """PLUGIN_INFO declaring only ``precisions``: the broken copies (conformance/tests/broken/flat_dp_*.py)
    are checked in the precisions their mistake needs, each precision costing a training run per property."""
    capabilities = dataclasses.replace(PLUGIN_INFO.capabilities, precisions=precisions)
    return dataclasses.replace(PLUGIN_INFO, capabilities=capabilities)


class FlatDataParallel(torch.nn.Module):
    """The user's module, with process 0's weights, averaging its gradients when asked."""

    def __init__(self, module: torch.nn.Module, source: int = 0) -> None:
        super().__init__()
        self.module = module
        self.require_sync = True
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=source)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients stay local (the kernel enters this between gradient accumulation boundaries)."""
        before, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = before

    def average_gradients(self, divide: bool = True) -> None:
        """One all-reduce of every gradient as a flat buffer, divided by the number of processes."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat)
        if divide:
            flat /= dist.get_world_size()
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def wrappers(accelerator: PluginAccelerator) -> list[FlatDataParallel]:
    """This Accelerator's wrapped models: ``accelerator.prepared.models`` holds what wrap_model returned."""
    return [model for model in accelerator.prepared.models if isinstance(model, FlatDataParallel)]


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> Any:
    return join_process_group(device, init_kwargs)


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    if evaluation_mode or accelerator.num_processes == 1:
        return None
    return FlatDataParallel(model)


@hookimpl
def backward(
    loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]
) -> bool | None:
    """Gradients are averaged by the end of the synchronised backward: clip_grad_norm_ reads them before
    optimizer.step()."""
    if accelerator.num_processes == 1:
        return None
    reference_backward(loss, accelerator, backward_kwargs)
    for wrapper in wrappers(accelerator):
        if wrapper.require_sync:
            wrapper.average_gradients()
    return True
