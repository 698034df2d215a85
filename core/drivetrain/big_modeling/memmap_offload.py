"""Accelerate's offload-folder format (``accelerate.utils.offload``): one raw ``<name>.dat`` file per tensor,
memory-mapped with numpy, and ``index.json`` giving each tensor's dtype and shape. drivetrain's own offloading
writes safetensors (``offload_index.py``); :class:`OffloadedWeightsLoader` reads both kinds of entry, so a folder
written by either works.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

INDEX_FILE = "index.json"


def _numpy_view(weight: torch.Tensor) -> tuple[Any, str | None]:
    """numpy has no bfloat16 nor 8-bit floats: those are written as their bits (int16, int8) and the index
    keeps the real dtype."""
    if weight.dtype == torch.bfloat16:
        return weight.view(torch.int16).cpu().numpy(), "bfloat16"
    if str(weight.dtype).startswith("torch.float8_"):
        return weight.view(torch.int8).cpu().numpy(), str(weight.dtype).removeprefix("torch.")
    return weight.cpu().numpy(), None


def offload_weight(
    weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike, index: dict | None = None
) -> dict | None:
    """Write ``weight`` to ``offload_folder/<weight_name>.dat`` and, when ``index`` is given, record its dtype
    and shape there; returns ``index``."""
    import numpy

    array, dtype = _numpy_view(weight.detach())
    if index is not None:
        index[weight_name] = {"dtype": dtype or str(array.dtype), "shape": list(array.shape)}
    if array.ndim == 0:  # a memory map needs at least one dimension
        array = array[None]
    mapped = numpy.memmap(
        os.path.join(offload_folder, f"{weight_name}.dat"), dtype=array.dtype, mode="w+", shape=array.shape
    )
    mapped[:] = array[:]
    mapped.flush()
    return index


def load_offloaded_weight(weight_file: str | os.PathLike, weight_info: dict[str, Any]) -> torch.Tensor:
    """The tensor :func:`offload_weight` wrote to ``weight_file``, with the dtype and shape of ``weight_info``."""
    import numpy

    dtype = weight_info["dtype"]
    stored = "int16" if dtype == "bfloat16" else "int8" if dtype.startswith("float8_") else dtype
    shape = tuple(weight_info["shape"]) or (1,)
    mapped = numpy.memmap(weight_file, dtype=stored, shape=shape, mode="r")
    tensor = torch.tensor(mapped[0] if not weight_info["shape"] else mapped)
    if stored != dtype:
        tensor = tensor.view(getattr(torch, dtype))
    return tensor


def save_offload_index(index: dict[str, Any] | None, offload_folder: str | os.PathLike) -> None:
    """Merge ``index`` into ``offload_folder/index.json`` (nothing is written for an empty index)."""
    if not index:
        return
    path = os.path.join(offload_folder, INDEX_FILE)
    current = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            current = json.load(handle)
    current.update(index)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(current, handle, indent=2)


def offload_state_dict(save_dir: str | os.PathLike, state_dict: dict[str, torch.Tensor]) -> None:
    """Write every tensor of ``state_dict`` into ``save_dir`` (created if needed), with its index."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


class PrefixedDataset(Mapping):
    """``dataset`` seen through ``prefix``: ``view[key]`` is ``dataset[prefix + key]``; iterating gives the
    keys of ``dataset`` that start with the prefix (as they are), and ``len`` the length of ``dataset``."""

    def __init__(self, dataset: Mapping, prefix: str):
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter([key for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self) -> int:
        return len(self.dataset)


class OffloadedWeightsLoader(Mapping):
    """The weights of a model whose tensors are partly in memory (``state_dict``, which wins) and partly on disk:
    ``.dat`` files in ``save_folder`` or safetensors files named by the index (``safetensors_file``, with
    ``weight_name`` and an optional ``dtype`` to cast to). The index defaults to ``save_folder/index.json``;
    tensors are read on access, onto ``device`` (CPU by default) for safetensors entries."""

    def __init__(
        self,
        state_dict: dict[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike | None = None,
        index: Mapping | None = None,
        device: Any = None,
    ):
        if state_dict is None and save_folder is None and index is None:
            raise ValueError(
                "Need either a `state_dict`, a `save_folder` or an `index` containing offloaded weights."
            )
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            with open(os.path.join(save_folder, INDEX_FILE), encoding="utf-8") as handle:
                index = json.load(handle)
        self.index = {} if index is None else index
        self.all_keys = list(self.state_dict)
        self.all_keys += [key for key in self.index if key not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if info.get("safetensors_file") is None:
            return load_offloaded_weight(os.path.join(self.save_folder, f"{key}.dat"), info)
        from safetensors import safe_open

        device = "cpu" if self.device is None else self.device
        try:
            with safe_open(info["safetensors_file"], framework="pt", device=device) as handle:
                tensor = handle.get_tensor(info.get("weight_name", key))
        except TypeError:  # a dtype the device cannot read directly: read on the CPU, then move
            with safe_open(info["safetensors_file"], framework="pt", device="cpu") as handle:
                tensor = handle.get_tensor(info.get("weight_name", key))
        if "dtype" in info:
            tensor = tensor.to(getattr(torch, info["dtype"]))
        if tensor.device != torch.device(device):
            tensor = tensor.to(device)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def extract_submodules_state_dict(
    state_dict: dict[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` belonging to the named submodules (``h.1`` takes ``h.1.*``, not ``h.10.*``)."""
    return {
        key: value
        for name in submodule_names
        for key, value in state_dict.items()
        if key == name or key.startswith(name + ".")
    }
