"""Collectives over XLA replicas (``xm.all_gather``, ``xm.all_reduce``, ``xm.collective_broadcast``,
``xm.rendezvous``), replacing the kernel's torch.distributed ones for gather, reduce and broadcast.

The recorded graph is cut (``torch_xla.sync()``) before each collective between replicas: what is gathered
is the value computed so far, and the training graph does not grow a collective per metric. In one process
(one device, or SPMD where one process drives every device and tensors are already global) every collective
is the identity, which is what torch_xla itself returns there; ``xm.reduce_scatter`` and ``xm.rendezvous``
even fail under SPMD, so they are never called then.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from drivetrain.plugin_api import Collectives
from drivetrain_xla import runtime

#: Collectives' reduction names -> torch_xla's (``mean`` is a sum divided by the world size).
_REDUCE_OPS = {"sum": "REDUCE_SUM", "mean": "REDUCE_SUM", "max": "REDUCE_MAX", "min": "REDUCE_MIN"}


class XlaCollectives(Collectives):
    """Primitives between the XLA replicas of a run (identities for one replica)."""

    def __init__(self, world_size: int, rank: int) -> None:
        self.world_size = world_size
        self.rank = rank
        self._tags = 0

    def _tag(self, what: str) -> str:
        # Every replica calls the same collectives in the same order, so a counter names them alike.
        self._tags += 1
        return f"drivetrain.{what}.{self._tags}"

    def barrier(self) -> None:
        if self.world_size > 1:
            runtime.modules()[1].rendezvous(self._tag("barrier"))

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.world_size == 1:
            return [tensor]
        runtime.sync()
        gathered = runtime.modules()[1].all_gather(tensor.unsqueeze(0), dim=0)
        return list(gathered.unbind(0))

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        payloads = runtime.modules()[1].rendezvous(self._tag("objects"), pickle.dumps(obj))
        return [pickle.loads(payload) for payload in payloads]

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        runtime.sync()
        runtime.modules()[1].collective_broadcast([tensor], root_ordinal=src)
        return tensor

    def broadcast_object_list(self, objects: list[Any], src: int = 0) -> list[Any]:
        if self.world_size == 1:
            return objects
        gathered = self.all_gather_object(list(objects) if self.rank == src else None)
        objects[:] = gathered[src]
        return objects

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op not in _REDUCE_OPS and op != "product":
            raise ValueError(f"unknown reduction {op!r}; valid: sum, mean, max, min, product")
        if self.world_size == 1:
            return tensor
        xm = runtime.modules()[1]
        runtime.sync()
        if op == "product":
            reduced = xm.all_reduce(xm.REDUCE_MUL, tensor)
        else:
            reduced = xm.all_reduce(getattr(xm, _REDUCE_OPS[op]), tensor)
        if op == "mean":
            reduced = reduced / self.world_size if reduced.is_floating_point() else reduced // self.world_size
        tensor.copy_(reduced)
        return tensor
