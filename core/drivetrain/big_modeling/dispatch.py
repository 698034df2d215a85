"""Putting a loaded (or partly loaded) model where its device map says, through the ``dispatch_module`` hook.

The kernel only decides *which* plugin does it: a map that puts everything on one device is honoured by the
reference backend ``local`` (a plain ``model.to``); a map that spans devices or offloads to CPU/disk needs
the ``offload`` plugin (``pip install drivetrain-offload``), which holds the module-hook machinery.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from drivetrain.big_modeling.device_map import (
    is_offload,
    main_device_of,
    normalize_device,
    resolve_device_map,
)
from drivetrain.big_modeling.loading import load_checkpoint_in_model
from drivetrain.compat.distributions import OFFLOAD_DISTRIBUTION
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.errors import PluginError


def needs_offload_plugin(device_map: dict[str, Any], main_device: Any) -> bool:
    """A map the reference backend cannot honour with one ``model.to``: several devices, disk, or weights
    kept away from the device that computes."""
    devices = {normalize_device(device) for device in device_map.values()}
    return len(devices) > 1 or "disk" in devices or normalize_device(main_device) not in devices


def offload_plugin_stack() -> Any:
    """The installed feature plugins that implement ``dispatch_module`` (drivetrain-offload, or a third
    party's), active together with the reference backend."""
    manager = get_plugin_registry()
    dispatchers = [
        name for name in manager.plugins_of_kind("feature") if "dispatch_module" in manager.hooks_of(name)
    ]
    if not dispatchers:
        raise PluginError(
            "this device map offloads weights or spans several devices, which needs the offload plugin; "
            f"install it with: pip install {OFFLOAD_DISTRIBUTION}"
        )
    return manager.stack(dispatchers)


def dispatch_model(
    model: torch.nn.Module,
    device_map: dict[str, Any],
    main_device: torch.device | str | int | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike | None = None,
    offload_index: dict[str, Any] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    prefetch: bool | None = None,
) -> torch.nn.Module:
    """Place the modules of ``model`` as ``device_map`` says and make forward work across them.

    Inputs go to ``main_device`` (default: the first GPU of the map, else CPU) and outputs come back to
    the device of the inputs. Weights mapped to ``"cpu"`` (while computing on a GPU) or ``"disk"`` stay
    there and visit the execution device only while their module runs. ``prefetch`` loads the next
    offloaded block while the current one computes, for one block of extra memory; the default (None)
    does so when computing on an accelerator or when weights are on disk (on the CPU it overlaps the disk
    reads with compute, measured in bench/big_model_load.py), not for CPU-offloaded weights run on the
    CPU, which are used in place. ``offload_dir`` holds the ``index.json`` written by :func:`load_checkpoint_in_model` for ``"disk"`` weights.
    """
    # Looked up on this package (drivetrain.big_modeling, already imported as this module's parent) when called,
    # as Accelerate's dispatch_model reads its module global: transformers swaps
    # ``accelerate.big_modeling.check_device_map`` for a no-op around dispatches whose map leaves some
    # parameters out on purpose (its skip_device_map_check).
    sys.modules[__package__].check_device_map(model, device_map)
    if main_device is None:
        main_device = main_device_of(device_map)
    main_device = normalize_device(main_device)
    if (
        any(normalize_device(d) == "disk" for d in device_map.values())
        and offload_dir is None
        and not offload_index
    ):
        raise ValueError("the device_map puts modules on 'disk'; pass offload_dir='path/to/folder'")
    use_plugin = force_hooks or needs_offload_plugin(device_map, main_device)
    stack = offload_plugin_stack() if use_plugin else get_plugin_registry().stack([])
    dispatched = stack.call(
        "dispatch_module",
        model=model,
        device_map=device_map,
        main_device=main_device,
        offload_dir=os.fspath(offload_dir) if offload_dir is not None else None,
        state_dict=state_dict,
        options={
            "offload_buffers": offload_buffers,
            "skip_keys": skip_keys,
            "preload_module_classes": preload_module_classes,
            "offload_index": offload_index,
            "prefetch": prefetch,
            "force_hooks": force_hooks,
        },
    )
    if dispatched is None:
        raise PluginError(
            f"no plugin could dispatch device map {device_map}; install the offload plugin with: "
            f"pip install {OFFLOAD_DISTRIBUTION}"
        )
    dispatched.hf_device_map = dict(device_map)
    return dispatched


def load_checkpoint_and_dispatch(
    model: torch.nn.Module,
    checkpoint: str | os.PathLike,
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_buffers: bool = False,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    prefetch: bool | None = None,
    map_weights: bool = True,
) -> torch.nn.Module:
    """Load ``checkpoint`` into ``model`` (typically built under :func:`init_empty_weights`) and dispatch it.

    ``device_map`` is a dict, or ``"auto"``/``"balanced"``/``"balanced_low_0"``/``"sequential"`` to infer
    one from ``max_memory`` (default: what each device has free); blocks of ``no_split_module_classes`` are
    never cut across devices. Without a device map the weights are only loaded. ``map_weights`` is
    :func:`load_checkpoint_in_model`'s (CPU weights as views of the mapped checkpoint, the default, or
    their own memory).
    """
    special_dtypes = {}
    if keep_in_fp32_modules and dtype is not None:
        special_dtypes = {
            name: torch.float32
            for name, _ in model.named_parameters()
            if any(module in name.split(".") for module in keep_in_fp32_modules)
        }
    device_map = resolve_device_map(
        model,
        device_map,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        special_dtypes=special_dtypes or None,
    )
    if offload_state_dict is None:
        offload_state_dict = device_map is not None and any(is_offload(d) for d in device_map.values())
    load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_state_dict=offload_state_dict,
        offload_buffers=offload_buffers,
        keep_in_fp32_modules=keep_in_fp32_modules,
        strict=strict,
        map_weights=map_weights,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map=device_map,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
        prefetch=prefetch,
    )
