"""The reference backend ``local``: one process on the CPU or the one visible accelerator.

It defines what "correct" means for the conformance suite and is the fallback for every first-result hook
another backend does not implement. Registered through the ``drivetrain.plugins`` entry point like any
third-party plugin, and like one it imports from the kernel only ``drivetrain.plugin_api``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from drivetrain.plugin_api import (
    Capabilities,
    DistributedEnvironment,
    DistributedType,
    PluginAccelerator,
    PluginInfo,
    ShardingOptions,
    environment_world_size,
    hookimpl,
)
from drivetrain.plugin_api.data import prepare_data_loader
from drivetrain.plugin_api.training import reference_backward

PLUGIN_INFO = PluginInfo(
    kind="backend",
    description="reference backend: one process, CPU or one GPU",
    capabilities=Capabilities(
        multi_process=False,
        precisions=("no", "bf16", "fp16"),
        devices=("cpu", "cuda"),
        portable_checkpoints=True,
    ),
)


@hookimpl
def detect_device(local_process_index: int, cpu: bool) -> torch.device:
    if not cpu and torch.cuda.is_available():
        return torch.device("cuda", local_process_index % torch.cuda.device_count())
    return torch.device("cpu")


@hookimpl
def setup_process_group(device: torch.device) -> DistributedEnvironment:
    world_size = environment_world_size()
    if world_size > 1:
        raise RuntimeError(
            f"backend 'local' runs one process, but this script was started as {world_size} processes "
            f"(WORLD_SIZE={os.environ.get('WORLD_SIZE')}); pick a multi-process backend with `--backend NAME` "
            "(`drivetrain plugins` lists the installed ones) or start a single process"
        )
    return DistributedEnvironment(distributed_type=DistributedType.NO)


@hookimpl
def wrap_model(model: torch.nn.Module) -> torch.nn.Module:
    # One process needs no wrapper: the kernel already placed the model on the device.
    return model


@hookimpl
def shard_dataloader(dataloader: Any, options: ShardingOptions) -> Any:
    return prepare_data_loader(dataloader, **options.to_kwargs())


_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@hookimpl
def autocast(
    accelerator: PluginAccelerator, autocast_kwargs: dict[str, Any]
) -> contextlib.AbstractContextManager:
    dtype = _AUTOCAST_DTYPES.get(accelerator.mixed_precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=accelerator.device.type, dtype=dtype, **autocast_kwargs)


@hookimpl
def backward(loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]) -> bool:
    reference_backward(loss, accelerator, backward_kwargs)
    return True


@hookimpl
def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float, norm_type: float) -> torch.Tensor:
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


@hookimpl
def save_state(
    output_dir: str,
    accelerator: PluginAccelerator,
    weights: list,
    optimizers: list,
    schedulers: list,
    safe_serialization: bool,
) -> bool:
    # Imported when a checkpoint is written: the checkpoint namespace brings the DCP reader with it.
    from drivetrain.plugin_api.checkpoint import write_training_objects

    write_training_objects(output_dir, accelerator, weights, optimizers, schedulers, safe_serialization)
    return True


@hookimpl
def load_state(
    input_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
    verified: Any,
) -> bool:
    from drivetrain.plugin_api.checkpoint import read_training_objects

    read_training_objects(
        input_dir, accelerator, models, optimizers, schedulers, map_location, load_kwargs, verified
    )
    return True


@hookimpl
def dispatch_module(model: torch.nn.Module, device_map: dict[str, Any], main_device: Any) -> Any:
    # Without the offload plugin, only maps that put every module on one real device can be honoured.
    devices = set(device_map.values())
    if len(devices) == 1 and not devices & {"disk", "meta"}:
        return model.to(next(iter(devices)))
    return None
