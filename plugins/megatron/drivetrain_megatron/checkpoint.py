"""Checkpoints per model-parallel rank: ``megatron/mp_rank_<tp>_<pp>/`` holds the weights, optimizer and
scheduler state of one tensor/pipeline shard, written by the first data-parallel replica of that shard;
``megatron/layout.json`` records the degrees. Loading on other degrees is refused (no resharding)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from drivetrain.plugin_api import CheckpointError, PluginAccelerator
from drivetrain.plugin_api.checkpoint import safe_load, torch_save_into_checkpoint
from drivetrain_megatron.config import MegatronLMPlugin
from drivetrain_megatron.process_group import layout

FOLDER = "megatron"
LAYOUT_FILE = "layout.json"
DEGREES = ("tp_degree", "pp_degree", "dp_degree")


def shard_folder(root: str, tp_rank: int, pp_rank: int) -> str:
    return os.path.join(root, FOLDER, f"mp_rank_{tp_rank:02d}_{pp_rank:03d}")


def _unwrapped(accelerator: PluginAccelerator, model: Any) -> Any:
    return accelerator.unwrap_model(model, keep_torch_compile=False)


def save(
    output_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
    config: MegatronLMPlugin,
) -> None:
    coordinates = layout()
    if accelerator.is_main_process:
        os.makedirs(os.path.join(output_dir, FOLDER), exist_ok=True)
        write_layout(coordinates, os.path.join(output_dir, FOLDER, LAYOUT_FILE))
    # on every rank: megatron-core's distributed optimizer gathers its shards to data-parallel rank 0
    optimizer_states = [] if config.no_save_optim else [optimizer.state_dict() for optimizer in optimizers]
    if coordinates["dp_rank"] != 0:
        return  # data-parallel replicas hold the same shard
    folder = shard_folder(output_dir, coordinates["tp_rank"], coordinates["pp_rank"])
    os.makedirs(folder, exist_ok=True)
    for index, model in enumerate(models):
        torch_save_into_checkpoint(
            _unwrapped(accelerator, model).state_dict(), os.path.join(folder, f"model_{index}.pt")
        )
    for index, state in enumerate(optimizer_states):
        torch_save_into_checkpoint(state, os.path.join(folder, f"optimizer_{index}.pt"))
    for index, scheduler in enumerate(schedulers):
        torch_save_into_checkpoint(scheduler.state_dict(), os.path.join(folder, f"scheduler_{index}.pt"))


def write_layout(data: dict[str, int], path: str) -> None:
    """The layout as JSON (readable without torch): every degree and the coordinates of process 0."""
    degrees = {name: data[name] for name in DEGREES}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(degrees, handle, indent=2)


def _check_layout(input_dir: str) -> None:
    path = os.path.join(input_dir, FOLDER, LAYOUT_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{input_dir} was not saved by the megatron backend ({os.path.join(FOLDER, LAYOUT_FILE)} is missing); "
            "load it with the backend that saved it"
        )
    with open(path, encoding="utf-8") as handle:
        saved = json.load(handle)
    current = layout()
    different = [
        f"{name} {saved.get(name)} -> {current[name]}" for name in DEGREES if saved.get(name) != current[name]
    ]
    if different:
        raise CheckpointError(
            f"{input_dir} was saved with other parallel degrees ({', '.join(different)}); drivetrain-megatron "
            "does not reshard checkpoints: load it with the degrees it was saved with"
        )


def load(
    input_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
    verified: Callable[[], None],
    config: MegatronLMPlugin,
) -> None:
    _check_layout(input_dir)
    coordinates = layout()
    folder = shard_folder(input_dir, coordinates["tp_rank"], coordinates["pp_rank"])
    location = accelerator.device if map_location == "on_device" else map_location

    def read(name: str) -> Any:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise CheckpointError(
                f"{path} not found: the checkpoint has no such shard (was it saved with the same prepared objects?)"
            )
        return safe_load(path, map_location=location, **load_kwargs)

    model_states = [read(f"model_{index}.pt") for index in range(len(models))]
    optimizer_states = (
        [] if config.no_load_optim else [read(f"optimizer_{i}.pt") for i in range(len(optimizers))]
    )
    scheduler_states = [read(f"scheduler_{index}.pt") for index in range(len(schedulers))]
    verified()
    for model, state in zip(models, model_states):
        _unwrapped(accelerator, model).load_state_dict(state)
    for optimizer, state in zip(optimizers, optimizer_states):
        optimizer.load_state_dict(state)
    for scheduler, state in zip(schedulers, scheduler_states):
        scheduler.load_state_dict(state)
