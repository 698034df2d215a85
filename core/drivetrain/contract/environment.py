"""What ``setup_process_group`` returns: where this process stands, and how processes exchange data.

A backend returns a :class:`DistributedEnvironment` whose :class:`Collectives` the kernel builds gather,
broadcast and reduce on (``drivetrain.operations``). The base class is the single-process identity;
``plugin_api.TorchCollectives`` is generic over ``torch.distributed``; a device plugin with its own
communication (XLA) subclasses :class:`Collectives`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from drivetrain.config import process_env
from drivetrain.config.enums import DistributedType

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


@dataclasses.dataclass
class DistributedEnvironment:
    """Where this process stands among the others, as the backend's ``setup_process_group`` reports it."""

    num_processes: int = 1
    process_index: int = 0
    local_process_index: int = 0
    #: processes on this machine
    local_num_processes: int = 1
    distributed_type: DistributedType = DistributedType.NO
    #: torch.distributed backend string ("gloo", "nccl", ...), None for one process
    torch_backend: str | None = None
    collectives: Collectives = dataclasses.field(default_factory=Collectives)
    #: a callable that tears the process group down at exit (None: nothing to do)
    shutdown: Callable[[], None] | None = None
    #: the run's ``torch.distributed.device_mesh.DeviceMesh`` with named dimensions, when the backend built one
    device_mesh: Any = None
    #: How many distinct shares of the data there are, and which one this process takes: the processes of one
    #: tensor- or context-parallel group see the same batches. ``None`` means every process is its own share
    #: (``num_processes`` / ``process_index``).
    data_parallel_size: int | None = None
    data_parallel_rank: int | None = None
    #: Context parallelism, when the backend runs a ``cp`` dimension: ``context_parallel(buffers=,
    #: buffer_seq_dims=, no_restore_buffers=)`` returns the context manager under which a step's sequences are
    #: sharded (``Accelerator.maybe_context_parallel`` enters it). ``None``: no context parallelism.
    context_parallel: Callable[..., Any] | None = None

    @property
    def data_shards(self) -> tuple[int, int]:
        """(number of data shares, this process's share)."""
        size = self.num_processes if self.data_parallel_size is None else self.data_parallel_size
        rank = self.process_index if self.data_parallel_rank is None else self.data_parallel_rank
        return size, rank


def environment_world_size() -> int:
    """How many processes the launcher started (torchrun's WORLD_SIZE; 1 when not launched). A value that is
    not a whole number >= 1 is an error naming the variable."""
    return process_env.world_size()
