"""Data loaders on XLA devices: the kernel's prepared loader, read in the training loop's own thread, with
each batch handed to the device the way torch_xla's parallel loader does it.

Per batch, as ``MpDeviceLoader`` does: the graph recorded for the previous step is cut and run
(``torch_xla.sync()``), and the batch goes to the device through ``xm.send_cpu_data_to_device`` (which,
under SPMD, also shards it over the mesh). Unlike ``MpDeviceLoader`` the loader is not read ahead on a
background thread: that thread would run the prepared loader's bookkeeping ahead of the batch in use, so
``end_of_dataloader`` (gradient accumulation, ``gather_for_metrics``) and the position a checkpoint saves
would describe a later batch than the one being trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from drivetrain_xla import runtime


def batch_sharding(mesh: Any) -> Any:
    """A ``ShardingSpec`` splitting the first dimension of every tensor over the mesh's ``data`` axis."""
    import torch_xla.distributed.spmd as xs

    class _FirstDimension(xs.ShardingSpec):
        # torch_xla's ShardingSpec holds one partition spec for every tensor of the batch; batches mix ranks
        # (inputs [B, F], labels [B]), so each tensor gets ("data", None, ...) of its own rank.
        def __init__(self) -> None:
            super().__init__(mesh, ("data",))

        def xla_spec(self, tensor: torch.Tensor) -> Any:
            self.partition_spec = ("data",) + (None,) * (tensor.dim() - 1)
            return super().xla_spec(tensor)

        def can_apply(self, tensor: torch.Tensor) -> bool:
            return tensor.dim() >= 1 and super().can_apply(tensor)

    return _FirstDimension()


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
        send = runtime.modules()[1].send_cpu_data_to_device
        for batch in self._loader:
            runtime.sync()
            yield send(batch, self._device, self._sharding)
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
