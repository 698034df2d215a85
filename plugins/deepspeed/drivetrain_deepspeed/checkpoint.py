"""save_state / load_state through the engines' own checkpointing.

Each training engine writes its folder ``pytorch_model`` (``pytorch_model_1``, ... for the next engines) inside the
kernel's temporary checkpoint folder: model weights, ZeRO partitions of the optimizer state (one file per
process) and a config-defined scheduler. Schedulers the script built itself are written as the reference
backend writes them (``scheduler.bin``). The kernel adds RNG states, data loader positions and registered
objects, then seals the folder with its manifest.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Iterator
from typing import Any

import torch

from drivetrain.plugin_api import CheckpointError, PluginAccelerator
from drivetrain.plugin_api.checkpoint import (
    checkpoint_path,
    read_scheduler_state,
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
    accelerator: PluginAccelerator,
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


def _deepspeed_checkpoint_classes() -> list[Any]:
    """The DeepSpeed classes its own checkpoint files hold (loss scalers, the ZeRO stage, fragment
    addresses): plain records, rebuilt without calling anything else; the names are looked up lazily since
    some are missing from older DeepSpeed releases."""
    import importlib

    found = []
    for module, name in (
        ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
        ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
        ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
        ("deepspeed.utils.tensor_fragment", "fragment_address"),
    ):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(getattr(importlib.import_module(module), name))
    return found


@contextlib.contextmanager
def _safe_engine_loading(engine: Any, load_kwargs: dict[str, Any]) -> Iterator[None]:
    """DeepSpeed reads its checkpoint files with ``torch.load(weights_only=False)``: a crafted checkpoint
    would run code. While the engine loads, its checkpoint engine reads them through ``safe_load`` instead
    (``weights_only=True`` plus the few DeepSpeed classes its files hold; ``load_kwargs`` carries the user's
    explicit opt-out)."""
    checkpoint_engine = engine.checkpoint_engine
    classes = _deepspeed_checkpoint_classes()

    def load(path: str, map_location: Any = None) -> Any:
        with torch.serialization.safe_globals(classes):
            return safe_load(path, map_location=map_location, **load_kwargs)

    checkpoint_engine.load = load
    try:
        yield
    finally:
        del checkpoint_engine.load


def _refuse_unsafe_files(folder: str) -> None:
    """Every file of an engine's folder is checked for objects that safe loading refuses before the engine
    reads any (reading only the pickles' opcodes, no tensor data), so a crafted optimizer file fails the load
    before DeepSpeed has overwritten the model from the model file."""
    allowed = {f"{cls.__module__}.{cls.__qualname__}" for cls in _deepspeed_checkpoint_classes()}
    for root, _dirs, names in os.walk(folder):
        for name in sorted(names):
            path = os.path.join(root, name)
            if not zipfile.is_zipfile(path):
                continue  # not a torch file (or the legacy format): safe_load still refuses code in it
            try:
                unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - allowed
            except Exception as exc:
                raise CheckpointError(f"{path} is unreadable ({type(exc).__name__}: {exc})") from None
            if unsafe:
                raise CheckpointError(
                    f"{path} holds objects that safe loading refuses ({', '.join(sorted(unsafe))}); nothing in it "
                    "was run or loaded. If you trust where this file came from, load it with "
                    "load_kwargs={'weights_only': False}"
                )


def _refuse_unlisted_files(input_dir: str, tag: str) -> None:
    """DeepSpeed picks the files of an engine's folder by their names: one that the checkpoint's manifest
    does not list (planted beside the engine's own) would be read. Such a folder is refused."""
    for root, _dirs, names in os.walk(os.path.join(input_dir, tag)):
        for name in sorted(names):
            relative = os.path.relpath(os.path.join(root, name), input_dir).replace(os.sep, "/")
            if checkpoint_path(input_dir, relative) is None:
                raise CheckpointError(
                    f"{os.path.join(input_dir, relative)} is not listed in the checkpoint's manifest: DeepSpeed "
                    f"would read it with the engine's files; remove it, or load a checkpoint whose {tag}/ folder "
                    "holds only what the save wrote"
                )


def load_state(
    input_dir: str,
    accelerator: PluginAccelerator,
    models: list[Any],
    schedulers: list[Any],
    map_location: Any,
    load_kwargs: dict[str, Any],
) -> None:
    engines = _training_engines(models)
    for index, _engine in engines:
        tag = engine_tag(index)
        folder = checkpoint_path(input_dir, tag)
        if folder is None or not os.path.isdir(folder):
            raise CheckpointError(
                f"{os.path.join(input_dir, tag)} not found: the checkpoint holds no DeepSpeed engine {index} (was it "
                "saved by the deepspeed backend with the same number of models?)"
            )
        _refuse_unlisted_files(input_dir, tag)
        if load_kwargs.get("weights_only", True):
            _refuse_unsafe_files(folder)
    # Read and checked before any engine changes its model, so a bad file leaves everything as it was.
    scheduler_states = [
        (scheduler, read_scheduler_state(input_dir, index, scheduler, map_location, load_kwargs))
        for index, scheduler in _user_schedulers(schedulers)
    ]
    for index, engine in engines:
        tag = engine_tag(index)
        with _safe_engine_loading(engine, load_kwargs):
            load_path, _ = engine.load_checkpoint(input_dir, tag=tag)
        if load_path is None:
            raise CheckpointError(
                f"DeepSpeed could not load engine {index} from {os.path.join(input_dir, tag)}"
            )
    for scheduler, state in scheduler_states:
        scheduler.load_state_dict(state)
