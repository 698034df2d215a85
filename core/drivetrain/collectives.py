"""Collective primitives over which the kernel builds gather, broadcast and reduce.

A backend returns a :class:`Collectives` in its :class:`~drivetrain.state.DistributedEnvironment`. The base
class is the single-process identity; :class:`TorchCollectives` is generic over ``torch.distributed`` and
serves DDP, FSDP and DeepSpeed alike; a device plugin (XLA) subclasses it with its own primitives. The
user-facing functions in ``drivetrain.operations`` add nesting, padding and checks on top.
"""

from __future__ import annotations

from typing import Any

import torch

REDUCTIONS = ("sum", "mean", "max", "min", "product")


class Collectives:
    """Primitives for one process: every collective returns its input."""

    world_size: int = 1
    rank: int = 0

    def barrier(self) -> None:
        """Wait until every process arrives."""

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every process's ``tensor`` (all of the same shape), ordered by rank."""
        return [tensor]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's picklable ``obj``, ordered by rank."""
        return [obj]

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``src``'s ``tensor`` on every process (in place where the backend allows)."""
        return tensor

    def broadcast_object_list(self, objects: list[Any], src: int = 0) -> list[Any]:
        """``src``'s list of picklable objects, written into ``objects`` in place."""
        return objects

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Element-wise reduction of every process's ``tensor`` (op in REDUCTIONS)."""
        if op not in REDUCTIONS:
            raise ValueError(f"unknown reduction {op!r}; valid: {', '.join(REDUCTIONS)}")
        return tensor


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
