"""Data loaders on XLA devices: the kernel's prepared loader, read in the training loop's own thread, with
each batch handed to the device the way torch_xla's parallel loader does it.

Per batch, as ``MpDeviceLoader`` does: the batch goes to the device through ``xm.send_cpu_data_to_device``
(which, under SPMD, also shards it over the mesh) and the graph recorded for the previous step is cut and
launched (``torch_xla.sync()``). Unlike ``MpDeviceLoader`` the loader is not read ahead on a
background thread: that thread would run the prepared loader's bookkeeping ahead of the batch in use, so
``end_of_dataloader`` (gradient accumulation, ``gather_for_metrics``) and the position a checkpoint saves
would describe a later batch than the one being trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from drivetrain_xla import runtime


class BatchSharding:
    """What ``xm.send_cpu_data_to_device`` takes as ``input_sharding``: each tensor of a batch split on its
    first dimension over the mesh axis ``axis`` (``"data"``; ``"fsdp"`` with FSDP via SPMD). torch_xla's own
    ``ShardingSpec`` has one partition spec for every tensor, and batches mix ranks (inputs ``[B, F]``, labels
    ``[B]``), so one spec per rank is kept."""

    #: torch_xla's per-host minibatch mode is not used: the loader yields the global batch
    minibatch = False

    def __init__(self, mesh: Any, axis: str) -> None:
        import numpy as np
        import torch_xla.distributed.spmd as xs

        # The batch is split over every device of the run's mesh; a one-axis mesh of the same devices lets
        # one-dimensional tensors be split too (a partition spec has one entry per tensor dimension).
        devices = np.asarray(mesh.device_ids).reshape(-1)
        self.mesh = xs.Mesh(devices, (len(devices),), (axis,))
        self.axis = axis
        self._specs: dict[int, Any] = {}

    def xla_spec(self, tensor: torch.Tensor) -> Any:
        rank = tensor.dim()
        if rank == 0:
            return None  # a scalar is replicated
        spec = self._specs.get(rank)
        if spec is None:
            import torch_xla.distributed.spmd as xs

            spec = self._specs[rank] = xs.ShardingSpec(self.mesh, (self.axis,) + (None,) * (rank - 1))
        return spec.xla_spec(tensor)


#: How many prepared XLA loaders are being iterated: while one is, the next batch it hands out cuts the graph,
#: so the optimizer step and backward need not (a second cut per step costs time, see bench/xla_step.py).
_iterating = 0


def graph_cut_by_loader() -> bool:
    """Whether a prepared XLA data loader is being iterated (it cuts the graph at its next batch)."""
    return _iterating > 0


class XlaDataLoader:
    """A prepared data loader whose batches arrive on the XLA device. Everything else (``len``,
    ``set_epoch``, ``end_of_dataloader``, ``remainder``, ``state_dict``/``load_state_dict``, ``dataset``,
    ``batch_size``, ``total_batch_size``...) is the prepared loader's."""

    def __init__(self, loader: Any, device: torch.device, sharding: Any = None) -> None:
        self._loader = loader
        self._device = device
        self._sharding = sharding

    @property
    def base_dataloader(self) -> Any:
        """The kernel's prepared loader this one reads (batches on the CPU)."""
        return self._loader

    @property
    def device(self) -> torch.device:
        return self._device

    def __iter__(self) -> Iterator[Any]:
        global _iterating
        send = runtime.modules()[1].send_cpu_data_to_device
        _iterating += 1
        try:
            for batch in self._loader:
                # The batch goes to the device before the previous step's graph is launched: launching is
                # asynchronous, so the loop traces the next step while the device runs the last one (a
                # transfer after the launch would wait for it).
                on_device = send(batch, self._device, self._sharding)
                runtime.sync()
                # torch_xla returns a one-tensor list for a tensor
                yield on_device[0] if isinstance(batch, torch.Tensor) else on_device
        finally:
            _iterating -= 1
            runtime.sync()

    def __len__(self) -> int:
        return len(self._loader)

    def skipping(self, num_batches: int) -> XlaDataLoader:
        """``skip_first_batches`` of this loader: the prepared loader's skipping copy, on the device."""
        return XlaDataLoader(self._loader.skipping(num_batches), self._device, self._sharding)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __repr__(self) -> str:
        return f"XlaDataLoader({self._loader!r}, device={self._device})"
