"""``ParallelismConfig``: how many ways the processes of a run split data, parameters and sequences.

One named ``DeviceMesh`` describes the layout: ``dp_replicate`` (data parallel, full copies), ``dp_shard``
(data parallel, sharded parameters: FSDP), ``cp`` (context parallel: sequence shards) and ``tp`` (tensor
parallel). Data is split over the data-parallel dimensions only. The backend builds the mesh in
``setup_process_group`` (``build_device_mesh``); a backend that cannot do a dimension says so, naming it.
"""

from __future__ import annotations

from typing import Any

import attrs

from drivetrain.errors import ConfigurationError

#: Mesh dimensions, outermost first (the order torch's device mesh lays out ranks in).
MESH_DIMENSIONS = ("dp_replicate", "dp_shard", "cp", "tp")


def _size(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigurationError(
            f"ParallelismConfig.{attribute.name} must be a whole number >= 1 (or None for 1), got {value!r}"
        )


@attrs.define
class ParallelismConfig:
    """Sizes of the parallel dimensions; ``None`` means 1. Their product must equal the number of processes."""

    dp_replicate_size: int | None = attrs.field(default=None, validator=_size)
    dp_shard_size: int | None = attrs.field(default=None, validator=_size)
    tp_size: int | None = attrs.field(default=None, validator=_size)
    cp_size: int | None = attrs.field(default=None, validator=_size)
    #: backend-specific options of the tensor- and context-parallel dimensions (handler objects)
    tp_handler: Any = None
    cp_handler: Any = None

    def size_of(self, dimension: str) -> int:
        return getattr(self, f"{dimension}_size") or 1

    @property
    def total_size(self) -> int:
        total = 1
        for dimension in MESH_DIMENSIONS:
            total *= self.size_of(dimension)
        return total

    @property
    def active_mesh_dims(self) -> list[str]:
        """The dimensions larger than 1, outermost first."""
        return [dimension for dimension in MESH_DIMENSIONS if self.size_of(dimension) > 1]

    @property
    def data_parallel_size(self) -> int:
        return self.size_of("dp_replicate") * self.size_of("dp_shard")

    def check_world_size(self, world_size: int) -> None:
        if self.total_size != world_size:
            sizes = " x ".join(f"{dimension}={self.size_of(dimension)}" for dimension in MESH_DIMENSIONS)
            raise ConfigurationError(
                f"ParallelismConfig sizes multiply to {self.total_size} ({sizes}) but the run has "
                f"{world_size} processes; make the product equal to the number of processes"
            )

    def build_device_mesh(self, device_type: str) -> Any:
        """torch's ``DeviceMesh`` over every process with the dimensions larger than 1 (all four names are
        kept when every size is 1, as a 1-process mesh)."""
        from torch.distributed.device_mesh import init_device_mesh

        dimensions = self.active_mesh_dims or ["dp_shard"]
        return init_device_mesh(
            device_type,
            tuple(self.size_of(dimension) for dimension in dimensions),
            mesh_dim_names=tuple(dimensions),
        )
