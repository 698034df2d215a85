"""save_state / load_state through the engines' own checkpointing.

Each training engine writes its folder ``pytorch_model`` (``pytorch_model_1``, ... for the next engines) inside the
kernel's temporary checkpoint folder: model weights, ZeRO partitions of the optimizer state (one file per
process) and a config-defined scheduler. Schedulers the script built itself are written as the reference
backend writes them (``scheduler.bin``). The kernel adds RNG states, data loader positions and registered
objects, then seals the folder with its manifest.
"""

from __future__ import annotations

import os
from typing import Any

from drivetrain.plugin_api import (
    CheckpointError,
    safe_load,
    scheduler_file_name,
    torch_save_into_checkpoint,
    writes_shared_files,
)
from drivetrain_deepspeed.dummies import DummyScheduler
from drivetrain_deepspeed.engine import record_of_engine

MODEL_FOLDER = "pytorch_model"


def engine_tag(index: int) -> str:
    """Folder of engine ``index`` inside a checkpoint (Accelerate's names)."""
    return MODEL_FOLDER if index == 0 else f"{MODEL_FOLDER}_{index}"


def _training_engines(models: list[Any]) -> list[tuple[int, Any]]:
    """(index, engine) of the engines that train. Inference engines (no optimizer: a frozen teacher) never
    change their weights and DeepSpeed gives them no checkpointing; they are left out."""
    engines = []
    for index, model in enumerate(models):
        record = record_of_engine(model)
        if record is None:
            raise CheckpointError(
                f"model {type(model).__name__} was not prepared by the deepspeed backend; prepare every model with "
                "the same Accelerator before save_state()/load_state()"
            )
        if record.user_optimizer is not None:
            engines.append((index, model))
    return engines


def _user_schedulers(schedulers: list[Any]) -> list[tuple[int, Any]]:
    # A DummyScheduler's real scheduler lives inside its engine and is saved with it.
    return [
        (index, s)
        for index, s in enumerate(schedulers)
        if not isinstance(getattr(s, "scheduler", s), DummyScheduler)
    ]


def save_state(
    output_dir: str,
    accelerator: Any,
    models: list[Any],
    schedulers: list[Any],
    save_model_func_kwargs: dict[str, Any],
) -> None:
    for index, engine in _training_engines(models):
        # save_latest=False: several engines share the folder, and the kernel's manifest marks completeness.
        engine.save_checkpoint(output_dir, tag=engine_tag(index), save_latest=False, **save_model_func_kwargs)
    if writes_shared_files(accelerator):
        for index, scheduler in _user_schedulers(schedulers):
            torch_save_into_checkpoint(
                scheduler.state_dict(), os.path.join(output_dir, scheduler_file_name(index))
            )


def load_state(
    input_dir: str,
    accelerator: Any,
    models: list[Any],
    schedulers: list[Any],
    map_location: Any,
    load_kwargs: dict[str, Any],
) -> None:
    for index, engine in _training_engines(models):
        tag = engine_tag(index)
        if not os.path.isdir(os.path.join(input_dir, tag)):
            raise CheckpointError(
                f"{os.path.join(input_dir, tag)} not found: the checkpoint holds no DeepSpeed engine {index} (was it "
                "saved by the deepspeed backend with the same number of models?)"
            )
        load_path, _ = engine.load_checkpoint(input_dir, tag=tag)
        if load_path is None:
            raise CheckpointError(
                f"DeepSpeed could not load engine {index} from {os.path.join(input_dir, tag)}"
            )
    for index, scheduler in _user_schedulers(schedulers):
        path = os.path.join(input_dir, scheduler_file_name(index))
        if not os.path.isfile(path):
            raise CheckpointError(f"{path} not found: the checkpoint has no state for scheduler {index}")
        scheduler.load_state_dict(safe_load(path, map_location=map_location, **load_kwargs))
