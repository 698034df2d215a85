"""Looking at (and temporarily materialising) the weights of a module that an offload hook manages."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from drivetrain_offload.module_hooks import AlignDevicesHook, hooks_of
from drivetrain_offload.weights import get_tensor, set_tensor, to_meta


def has_offloaded_params(module: torch.nn.Module) -> bool:
    """True when ``module`` carries a module hook that offloads its weights (they are on meta between
    forwards)."""
    return any(isinstance(hook, AlignDevicesHook) and hook.offload for hook in hooks_of(module))


@contextlib.contextmanager
def align_module_device(
    module: torch.nn.Module, execution_device: torch.device | str | None = None
) -> Iterator[None]:
    """Inside the block, the module's direct parameters are real tensors (on ``execution_device`` if given):
    offloaded weights are brought in, and put back when the block ends."""
    hooks = [hook for hook in hooks_of(module) if isinstance(hook, AlignDevicesHook) and hook.offload]
    if hooks:
        hook = hooks[0]
        device = execution_device if execution_device is not None else hook.execution_device
        weights = hook.weights_map
        assert weights is not None  # an offloading hook reads its weights from this map
        names = [name for name, _ in module.named_parameters(recurse=False)]
        for name in names:
            set_tensor(module, name, weights[name].to(device))
        try:
            yield
        finally:
            for name in names:
                set_tensor(module, name, to_meta(get_tensor(module, name)))
        return
    if execution_device is None:
        yield
        return
    originals = {name: tensor.device for name, tensor in module.named_parameters(recurse=False)}
    for name in originals:
        set_tensor(module, name, get_tensor(module, name).data.to(execution_device))
    try:
        yield
    finally:
        for name, device in originals.items():
            set_tensor(module, name, get_tensor(module, name).data.to(device))
