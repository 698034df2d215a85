"""Collectives through ``torch.distributed``: the implementation DDP, FSDP and DeepSpeed share.

A device plugin with its own communication (XLA) subclasses :class:`~drivetrain.contract.environment.Collectives`
instead.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.contract.environment import REDUCTIONS, Collectives


class TorchCollectives(Collectives):
    """Primitives through ``torch.distributed`` on the default process group (or ``group``)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        tensor = tensor.contiguous()
        outputs = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._dist.all_gather(outputs, tensor, group=self.group)
        return outputs

    def all_gather_object(self, obj: Any) -> list[Any]:
        outputs: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(outputs, obj, group=self.group)
        return outputs

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        self._dist.broadcast(tensor, src=src, group=self.group)
        return tensor

    def broadcast_object_list(self, objects: list[Any], src: int = 0) -> list[Any]:
        self._dist.broadcast_object_list(objects, src=src, group=self.group)
        return objects

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        reduce_op = {
            "sum": self._dist.ReduceOp.SUM,
            "mean": self._dist.ReduceOp.SUM,
            "max": self._dist.ReduceOp.MAX,
            "min": self._dist.ReduceOp.MIN,
            "product": self._dist.ReduceOp.PRODUCT,
        }.get(op)
        if reduce_op is None:
            raise ValueError(f"unknown reduction {op!r}; valid: {', '.join(REDUCTIONS)}")
        self._dist.all_reduce(tensor, op=reduce_op, group=self.group)
        if op == "mean":
            # gloo has no AVG; dividing after a SUM is exact for the integer and float types used here.
            if tensor.is_floating_point():
                tensor.div_(self.world_size)
            else:
                tensor.floor_divide_(self.world_size)
        return tensor
