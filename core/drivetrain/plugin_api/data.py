"""Data loaders and batches: the reference sharding of a data loader (what ``shard_dataloader`` falls back
to) and moving nested batches to a device."""

from __future__ import annotations

from drivetrain.data import prepare_data_loader
from drivetrain.operations.nested import find_device, send_to_device

__all__ = ["prepare_data_loader", "send_to_device", "find_device"]
