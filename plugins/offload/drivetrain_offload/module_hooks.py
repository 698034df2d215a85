"""Module hooks: code that runs around a ``torch.nn.Module``'s forward (not to be confused with the
*plugin* hooks of ``drivetrain.contract.hookspecs``).

``add_hook_to_module`` replaces ``module.forward`` by a wrapper calling ``hook.pre_forward`` (which may
change the arguments), the original forward, then ``hook.post_forward`` (which may change the output).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain.plugin_api.data import find_device, send_to_device
from drivetrain_offload.weights import (
    OffloadedWeights,
    get_tensor,
    module_tensors,
    read_unique,
    read_weight,
    set_tensor,
    source_key,
    to_meta,
    unique_key,
)


class ModelHook:
    """Base class of module hooks; every method is a no-op. ``no_grad`` runs the forward without autograd."""

    no_grad = False

    def init_hook(self, module: torch.nn.Module) -> torch.nn.Module:
        """Called when the hook is attached; returns the module."""
        return module

    def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        return args, kwargs

    def post_forward(self, module: torch.nn.Module, output: Any) -> Any:
        return output

    def detach_hook(self, module: torch.nn.Module) -> torch.nn.Module:
        """Called when the hook is removed; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks applied in order (post_forward too)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = list(hooks)

    def init_hook(self, module: torch.nn.Module) -> torch.nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: torch.nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: torch.nn.Module) -> torch.nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def hooks_of(module: torch.nn.Module) -> list[ModelHook]:
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(hook.hooks) if isinstance(hook, SequentialHook) else [hook]


def add_hook_to_module(module: Any, hook: ModelHook, append: bool = False) -> torch.nn.Module:
    """Attach ``hook`` to ``module`` (replacing its hook, or after it with ``append=True``). ``module`` is a
    ``torch.nn.Module``, typed ``Any``: the hook lives in attributes torch's type does not declare."""
    if append and getattr(module, "_hf_hook", None) is not None:
        previous = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        module._hf_hook.detach_hook(module)
        old_forward = module._old_forward
    else:
        old_forward = module.forward
        module._old_forward = old_forward
    module = hook.init_hook(module)
    module._hf_hook = hook

    @functools.wraps(old_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = module._hf_hook.pre_forward(module, *args, **kwargs)
        if module._hf_hook.no_grad:
            with torch.no_grad():
                output = module._old_forward(*args, **kwargs)
        else:
            output = module._old_forward(*args, **kwargs)
        return module._hf_hook.post_forward(module, output)

    # An instance attribute shadows the class's forward; __call__ finds it.
    module.forward = forward
    return module


def remove_hook_from_module(module: Any, recurse: bool = False) -> torch.nn.Module:
    """Detach the module hook of ``module`` (and of its submodules with ``recurse``), restoring forward."""
    if hasattr(module, "_hf_hook"):
        module._hf_hook.detach_hook(module)
        del module._hf_hook
    if hasattr(module, "_old_forward"):
        if "forward" in module.__dict__:
            del module.forward
        if getattr(module._old_forward, "__func__", None) is not type(module).forward:
            module.forward = module._old_forward
        del module._old_forward
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: torch.nn.Module) -> None:
    """Detach the module hooks of every submodule of ``module`` (not of ``module`` itself)."""
    for child in module.children():
        remove_hook_from_module(child, recurse=True)


class AlignDevicesHook(ModelHook):
    """Run a module on ``execution_device``: inputs are moved there, and with ``offload`` its weights are
    brought from ``weights_map`` before forward and dropped (to the meta device) after.

    :param io_same_device: outputs go back to the device of the inputs.
    :param place_submodules: the hook manages the tensors of all submodules, not only the direct ones.
    :param offload_buffers: buffers are offloaded too (else they live on the execution device).
    :param skip_keys: keyword arguments (or mapping keys) never moved.
    :param tied_params_map: shared by the hooks of one model: ``{source key: {device: tensor}}`` with one
        entry per tied weight (source key: the data pointer of a tensor kept in memory, or the file entry of
        one on disk). While a hook has a tied weight on its execution device it records it there, and any
        other hook needing the same weight meanwhile (a module whose forward runs a submodule sharing its
        weight) takes that tensor instead of reading and allocating it again. The entry is dropped at the
        recording hook's post_forward. Tied names within one hook always share one read.
    """

    def __init__(
        self,
        execution_device: torch.device | str | int | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: dict | None = None,
    ) -> None:
        self.execution_device = _as_device(execution_device)
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None
        self.prefetcher: Any = None  # set by dispatch: brings the next block in while this one runs
        self.tensor_names: list[str] = []
        #: When set, the only (direct) tensors this hook offloads: a module split between devices.
        self.managed: list[str] | None = None
        self.original_devices: dict[str, torch.device] = {}
        self._tied_added: list[tuple[Any, torch.device]] = []

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules})"
        )

    def init_hook(self, module: torch.nn.Module) -> torch.nn.Module:
        if not self.offload:
            if self.execution_device is not None:
                moved: dict[int, torch.Tensor] = {}  # tied names move once and stay one tensor
                for name in module_tensors(module, self.place_submodules, include_buffers=True):
                    tensor = get_tensor(module, name)
                    if tensor.device.type == "meta" or tensor.device == self.execution_device:
                        continue
                    if id(tensor) in moved:
                        set_tensor(module, name, moved[id(tensor)])
                        continue
                    entry = self._tied_entry(tensor.data_ptr())
                    shared = entry.get(self.execution_device) if entry is not None else None
                    if shared is not None and shared.shape == tensor.shape and shared.dtype == tensor.dtype:
                        moved[id(tensor)] = set_tensor(module, name, shared)
                        continue
                    placed = set_tensor(module, name, tensor.data.to(self.execution_device))
                    moved[id(tensor)] = placed
                    if entry is not None:
                        entry[self.execution_device] = placed
            return module
        self.tensor_names = module_tensors(
            module, self.place_submodules, include_buffers=self.offload_buffers
        )
        if self.managed is not None:
            self.tensor_names = [name for name in self.tensor_names if name in self.managed]
        self.original_devices = {name: get_tensor(module, name).device for name in self.tensor_names}
        if self.weights_map is None:
            # Offloading a module whose weights are in memory: keep them (on CPU) as the weights map.
            self.weights_map = OffloadedWeights(
                {name: get_tensor(module, name).data.to("cpu") for name in self.tensor_names}
            )
        for name in self.tensor_names:
            set_tensor(module, name, to_meta(get_tensor(module, name)))
        if not self.offload_buffers and self.execution_device is not None:
            for name, buffer in module.named_buffers(recurse=self.place_submodules):
                if buffer.device.type != "meta":
                    set_tensor(module, name, buffer.to(self.execution_device))
        return module

    def load_weights(self) -> dict[str, torch.Tensor]:
        """This module's offloaded tensors, on the execution device (tied names read once)."""
        device = self.execution_device or torch.device("cpu")
        weights = self.weights_map
        return read_unique(self.tensor_names, weights, lambda name: read_weight(weights, name).to(device))  # type: ignore[arg-type]

    def _tied_entry(self, key: Any) -> dict | None:
        if self.tied_params_map is None:
            return None
        try:
            return self.tied_params_map.get(key)
        except TypeError:  # an unhashable key cannot be a tied weight
            return None

    def _onload(self, module: torch.nn.Module, prefetched: dict[str, torch.Tensor] | None) -> None:
        """Put this module's offloaded tensors in it, on the execution device: tied names as one tensor,
        read once, and a tied weight that another active hook already has on this device is taken from
        ``tied_params_map`` instead of being read and allocated again."""
        device = self.execution_device or torch.device("cpu")
        weights: Mapping = self.weights_map  # type: ignore[assignment]
        placed: dict[Any, torch.Tensor] = {}  # stored tensor -> what was put in the module
        for name in self.tensor_names:
            key = source_key(weights, name)
            exact = unique_key(weights, name, key)
            if exact in placed:
                set_tensor(module, name, placed[exact])
                continue
            entry = self._tied_entry(key)
            shared = entry.get(device) if entry is not None else None
            if shared is not None and shared.shape == get_tensor(module, name).shape:
                placed[exact] = set_tensor(module, name, shared)
                continue
            tensor = prefetched.get(name) if prefetched is not None else None
            if tensor is None:
                tensor = read_weight(weights, name).to(device)
            placed[exact] = set_tensor(module, name, tensor)
            if entry is not None:
                entry[device] = placed[exact]
                self._tied_added.append((entry, device))

    def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            self._onload(module, self.prefetcher.fetch(self) if self.prefetcher is not None else None)
        if self.execution_device is None:
            return args, kwargs
        return (
            send_to_device(args, self.execution_device),
            send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys),
        )

    def post_forward(self, module: torch.nn.Module, output: Any) -> Any:
        if self.offload:
            for name in self.tensor_names:
                set_tensor(module, name, to_meta(get_tensor(module, name)))
            # Forget the tied weights this hook lent to others, so that their memory can be freed.
            for entry, device in self._tied_added:
                entry.pop(device, None)
            self._tied_added = []
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.offload:
            for name in self.tensor_names:
                set_tensor(module, name, self.weights_map[name].to(self.original_devices.get(name, "cpu")))  # type: ignore[index]
        return module


class CpuOffloadHook(ModelHook):
    """Moves the whole module to ``execution_device`` before forward, and leaves it there until
    ``offload()`` is called (on the hook or by the next model of a chain)."""

    def __init__(
        self,
        execution_device: torch.device | str | int | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        self.execution_device = _as_device(execution_device) or torch.device("cpu")
        self.prev_module_hook = prev_module_hook

    def init_hook(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


#: Accelerate's name for this hook (``accelerate.hooks.CpuOffload``).
CpuOffload = CpuOffloadHook


class UserCpuOffloadHook:
    """Handle returned by ``cpu_offload_with_hook``: ``offload()`` sends the model back to the CPU,
    ``remove()`` takes the module hook off."""

    def __init__(self, model: torch.nn.Module, hook: CpuOffloadHook) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)


def _as_device(device: Any) -> torch.device | None:
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)
