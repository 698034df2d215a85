"""Local SGD: each process steps its own replica and the replicas are averaged every N optimizer steps."""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.plugin_api import DistributedType, PluginAccelerator

#: Where a model is a plain replica per process whose parameters can be averaged with an all-reduce.
SUPPORTED_TYPES = (
    DistributedType.NO,
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_HPU,
)


class LocalSGD:
    """Context manager that turns off DDP's per-step gradient all-reduce and averages parameters instead.

    ``with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:`` then call
    ``local_sgd.step()`` after every ``optimizer.step()``. Parameters are averaged across processes every
    ``local_sgd_steps`` calls and once more when the block ends. In one process (or with
    ``enabled=False``) it does nothing, so the same script runs everywhere. Gradient accumulation inside
    the block keeps working: gradients accumulate locally and the optimizer steps at the usual boundaries.
    """

    def __init__(
        self,
        accelerator: PluginAccelerator,
        model: torch.nn.Module,
        local_sgd_steps: int,
        enabled: bool = True,
    ):
        if accelerator.distributed_type not in SUPPORTED_TYPES:
            raise NotImplementedError(
                f"LocalSGD averages plain per-process replicas (ddp backend); it does not support "
                f"distributed_type {accelerator.distributed_type} (backend {accelerator.backend_plugin!r})"
            )
        if not isinstance(local_sgd_steps, int) or isinstance(local_sgd_steps, bool) or local_sgd_steps < 1:
            raise ValueError(f"LocalSGD local_sgd_steps must be an integer >= 1, got {local_sgd_steps!r}")
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and accelerator.num_processes > 1
        self.num_steps = 0
        self._no_sync: Any = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            no_sync = getattr(self.model, "no_sync", None)
            if no_sync is not None:
                self._no_sync = no_sync()
                self._no_sync.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if not self.enabled:
            return
        try:
            if exc_type is None:
                # Leave every replica equal, whatever step the loop stopped at.
                self._average_parameters()
        finally:
            if self._no_sync is not None:
                self._no_sync.__exit__(exc_type, exc_value, traceback)
                self._no_sync = None

    def step(self) -> None:
        """Count one optimizer step; average the parameters when ``local_sgd_steps`` are reached."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average_parameters()

    @torch.no_grad()
    def _average_parameters(self) -> None:
        collectives = self.accelerator.state.collectives
        for parameter in self.model.parameters():
            collectives.all_reduce(parameter.data, "mean")
