"""Where offloaded weights are kept, and swapping them in and out of a module."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import torch
from safetensors import safe_open

from drivetrain.plugin_api import CheckpointError
from drivetrain.plugin_api.big_model import (
    TensorRecord,
    can_map,
    load_offload_index,
    map_tensor,
    populate,
    read_header,
)


class OffloadedWeights(Mapping):
    """Tensors by full name: some held in RAM, the others read from memory-mapped safetensors files.

    Reading a disk weight costs no copy when no dtype cast is needed: the tensor is a view of its own
    private mapping of the file (``read`` also brings its pages in, in one request). Once the module that used it drops it, the
    mapping goes and the pages leave the process's memory (the page cache keeps them while memory allows),
    so running a disk-offloaded model holds one block of weights at a time, not the whole checkpoint.
    """

    def __init__(
        self,
        in_memory: dict[str, torch.Tensor] | None = None,
        index: dict[str, dict[str, Any]] | None = None,
        folder: str | None = None,
    ) -> None:
        self.in_memory = dict(in_memory or {})
        self.index = dict(load_offload_index(folder)) if folder else {}
        self.index.update(index or {})
        self._headers: dict[str, dict[str, TensorRecord]] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.in_memory:
            return self.in_memory[name]
        entry = self.index[name]
        file = entry["safetensors_file"]
        key = entry.get("weight_name", name)
        with self._lock:
            records = self._headers.get(file)
            if records is None:
                if not os.path.isfile(file):
                    raise CheckpointError(
                        f"offloaded weight {name!r} is read from {file}, which does not exist (moved or deleted "
                        "after loading?); load the checkpoint again"
                    )
                records = self._headers[file] = read_header(file)
        record = records.get(key)
        if record is None and key not in records:
            raise CheckpointError(
                f"offloaded weight {name!r}: {file} holds no tensor {key!r} (the offload index and the file "
                "disagree); load the checkpoint again"
            )
        if record is not None and can_map(record):
            tensor = map_tensor(file, record)
        else:  # empty or misaligned tensors
            with safe_open(file, framework="pt", device="cpu") as handle:
                tensor = handle.get_tensor(key)
        dtype = entry.get("dtype")
        if dtype is not None and str(tensor.dtype) != f"torch.{dtype}":
            tensor = tensor.to(getattr(torch, dtype))
        return tensor

    def __contains__(self, name: object) -> bool:
        return name in self.in_memory or name in self.index

    def read(self, name: str) -> torch.Tensor:
        """``self[name]``, with the pages of a disk weight already read (one large request)."""
        tensor = self[name]
        if name not in self.in_memory:
            populate(tensor)
        return tensor

    def source_key(self, name: str) -> Hashable:
        """What identifies the stored tensor behind ``name`` (tied names share it): the data pointer of a
        tensor kept in memory (as Accelerate's ``tied_params_map`` keys), the file entry of one on disk."""
        if name in self.in_memory:
            return self.in_memory[name].data_ptr()
        entry = self.index[name]
        return ("disk", entry["safetensors_file"], entry.get("weight_name", name), entry.get("dtype"))

    def on_disk(self, name: str) -> bool:
        """True when ``name`` is read from a file (its pages may not be in memory yet)."""
        return name not in self.in_memory and name in self.index

    def __iter__(self) -> Iterator[str]:
        yield from self.in_memory
        yield from (name for name in self.index if name not in self.in_memory)

    def __len__(self) -> int:
        return len(set(self.in_memory) | set(self.index))


def build_tied_params_map(model: torch.nn.Module, weights: OffloadedWeights, tied: list[str]) -> dict:
    """One empty entry per tied weight, under the key the module hooks look it up by: the weight's source
    in ``weights`` when offloaded, else the data pointer of the tensor the model holds."""
    entries: dict = {}
    for name in tied:
        if name in weights:
            entries.setdefault(weights.source_key(name), {})
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        tensor = owner._parameters.get(attr)
        if tensor is not None and tensor.device.type != "meta":
            entries.setdefault(tensor.data_ptr(), {})
    return entries


class PrefixedWeights(Mapping):
    """The entries of a weights mapping under ``prefix.``, by their name relative to a submodule."""

    def __init__(self, weights: Mapping, prefix: str) -> None:
        self.weights = weights
        self.prefix = prefix

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.weights[self.prefix + name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.prefix + name in self.weights

    def on_disk(self, name: str) -> bool:
        return on_disk(self.weights, self.prefix + name)

    def read(self, name: str) -> torch.Tensor:
        return read_weight(self.weights, self.prefix + name)

    def source_key(self, name: str) -> Hashable:
        return source_key(self.weights, self.prefix + name)

    def __iter__(self) -> Iterator[str]:
        return (name[len(self.prefix) :] for name in self.weights if name.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def on_disk(weights: Mapping, name: str) -> bool:
    return bool(getattr(weights, "on_disk", lambda _: False)(name))


def read_weight(weights: Mapping, name: str) -> torch.Tensor:
    """``weights[name]`` ready to compute with: a disk weight's pages are read in now."""
    method = getattr(weights, "read", None)
    return method(name) if method is not None else weights[name]


def source_key(weights: Mapping, name: str) -> Hashable:
    """The identity of the stored tensor behind ``name`` in ``weights``: equal for tied names. A plain
    mapping of tensors (a user's state dict) is keyed by data pointer, as Accelerate does."""
    method = getattr(weights, "source_key", None)
    if method is not None:
        return method(name)
    return weights[name].data_ptr()


def unique_key(weights: Mapping, name: str, key: Hashable | None = None) -> Hashable:
    """``source_key``, made exact for a data pointer (a view of the same memory may have another shape)."""
    key = source_key(weights, name) if key is None else key
    if isinstance(key, int):
        stored = weights[name]
        return (key, tuple(stored.shape), stored.stride(), stored.dtype)
    return key


def read_unique(
    names: list[str], weights: Mapping, read: Callable[[str], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``read(name)`` for each of ``names``, once per stored tensor: tied names get the same tensor."""
    by_source: dict[Hashable, torch.Tensor] = {}
    tensors = {}
    for name in names:
        key = unique_key(weights, name)
        if key not in by_source:
            by_source[key] = read(name)
        tensors[name] = by_source[key]
    return tensors


def module_tensors(module: torch.nn.Module, recurse: bool, include_buffers: bool) -> list[str]:
    """Relative names of the tensors a module hook manages (tied duplicates included)."""
    names = [name for name, _ in module.named_parameters(recurse=recurse, remove_duplicate=False)]
    if include_buffers:
        names += [name for name, _ in module.named_buffers(recurse=recurse, remove_duplicate=False)]
    return names


def set_tensor(module: torch.nn.Module, name: str, value: torch.Tensor) -> torch.Tensor:
    """Replace tensor ``name`` (dotted, relative to ``module``) by ``value``, keeping it a Parameter if it
    was one. Returns what was put in the module."""
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if attr in owner._parameters:
        old = owner._parameters[attr]
        if not isinstance(value, torch.nn.Parameter):
            requires_grad = old.requires_grad if old is not None and value.is_floating_point() else False
            value = torch.nn.Parameter(value, requires_grad=requires_grad)
        owner._parameters[attr] = value
    else:
        owner._buffers[attr] = value
    return value


def get_tensor(module: torch.nn.Module, name: str) -> torch.Tensor:
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    tensor = owner._parameters[attr] if attr in owner._parameters else owner._buffers[attr]
    assert tensor is not None, f"{name} is declared but holds no tensor"  # torch's slots may hold None
    return tensor


def to_meta(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
