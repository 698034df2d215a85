"""Batch surgery for the dispatcher: length, slicing, concatenation and broadcasting of nested batches.

A batch is what a ``collate_fn`` returns: tensors, and lists / tuples / dicts / namedtuples of them. A list
or tuple of plain values (strings, numbers: what ``default_collate`` makes of a string field) counts as a
batch dimension of its own, so it is sliced and concatenated like a tensor rather than copied whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from drivetrain.operations.nested import honor_type, rebuild_mapping


def _is_values(data: Any) -> bool:
    """A list/tuple of plain values: one value per sample."""
    return isinstance(data, (list, tuple)) and not any(
        isinstance(item, (torch.Tensor, list, tuple, Mapping)) for item in data
    )


def _map(function: Callable[[Any], Any], data: Any) -> Any:
    """Apply ``function`` to every per-sample leaf (tensor or list of values) of ``data``."""
    if isinstance(data, torch.Tensor) or _is_values(data):
        return function(data)
    if isinstance(data, (list, tuple)):
        return honor_type(data, [_map(function, item) for item in data])
    if isinstance(data, Mapping):
        return rebuild_mapping(data, {key: _map(function, value) for key, value in data.items()})
    return data


def batch_length(data: Any) -> int:
    """Number of samples in ``data`` (first dimension of its first per-sample leaf)."""
    if isinstance(data, torch.Tensor):
        return data.shape[0]
    if _is_values(data):
        return len(data)
    items = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    for item in items:
        length = batch_length(item)
        if length >= 0:
            return length
    return -1


def slice_batch(
    data: Any, data_slice: slice, process_index: int | None = None, num_processes: int | None = None
) -> Any:
    """``data`` restricted to the samples in ``data_slice`` (the default ``slice_fn_for_dispatch``)."""
    return _map(lambda leaf: leaf[data_slice], data)


def concatenate_batches(batches: list[Any]) -> Any:
    """One batch made of ``batches`` one after the other."""
    first = batches[0]
    if len(batches) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(batches)
    if _is_values(first):
        return honor_type(first, [value for batch in batches for value in batch])
    if isinstance(first, (list, tuple)):
        return honor_type(
            first, [concatenate_batches([batch[i] for batch in batches]) for i in range(len(first))]
        )
    if isinstance(first, Mapping):
        return rebuild_mapping(
            first, {key: concatenate_batches([batch[key] for batch in batches]) for key in first}
        )
    return first


def pad_batch(data: Any, head: Any, target: int) -> Any:
    """``data`` lengthened to ``target`` samples with samples of ``head``, taken from its start again and
    again (``head`` is the first batch of the epoch)."""
    missing = target - batch_length(data)
    if missing <= 0:
        return data
    head_length = max(batch_length(head), 1)
    repeats = -(-missing // head_length)
    filler = slice_batch(concatenate_batches([head] * repeats), slice(0, missing))
    return concatenate_batches([data, filler])


class _TensorSlot:
    """Where a tensor sits in a broadcast batch (its shape and dtype travel, its data follows)."""

    __slots__ = ("dtype", "shape")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype


def _tensors_and_layout(data: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(data, torch.Tensor):
        tensors.append(data)
        return _TensorSlot(data)
    if isinstance(data, (list, tuple)):
        return honor_type(data, [_tensors_and_layout(item, tensors) for item in data])
    if isinstance(data, Mapping):
        return rebuild_mapping(
            data, {key: _tensors_and_layout(value, tensors) for key, value in data.items()}
        )
    return data


def _fill(layout: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(layout, _TensorSlot):
        return tensors.pop(0)
    if isinstance(layout, (list, tuple)):
        return honor_type(layout, [_fill(item, tensors) for item in layout])
    if isinstance(layout, Mapping):
        return rebuild_mapping(layout, {key: _fill(value, tensors) for key, value in layout.items()})
    return layout


def broadcast_batch(collectives: Any, data: Any, extra: Any, device: torch.device, is_source: bool) -> tuple:
    """Process 0's ``(data, extra)`` on every process: the layout, plain values and ``extra`` travel in one
    object broadcast, each tensor in a tensor broadcast on ``device``."""
    tensors: list[torch.Tensor] = []
    message: list[Any] = [(_tensors_and_layout(data, tensors), extra) if is_source else None]
    collectives.broadcast_object_list(message, src=0)
    layout, extra = message[0]
    if is_source:
        received = [collectives.broadcast(tensor.to(device).contiguous(), src=0) for tensor in tensors]
    else:
        slots: list[_TensorSlot] = []
        _collect_slots(layout, slots)
        received = [
            collectives.broadcast(torch.empty(slot.shape, dtype=slot.dtype, device=device), src=0)
            for slot in slots
        ]
    return _fill(layout, received), extra


def _collect_slots(layout: Any, slots: list[_TensorSlot]) -> None:
    if isinstance(layout, _TensorSlot):
        slots.append(layout)
    elif isinstance(layout, (list, tuple)):
        for item in layout:
            _collect_slots(item, slots)
    elif isinstance(layout, Mapping):
        for value in layout.values():
            _collect_slots(value, slots)
