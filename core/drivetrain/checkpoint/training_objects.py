"""Which file holds which training object inside a checkpoint folder, and how each is written and read.

The names are Accelerate's (``model.safetensors``, ``optimizer.bin``, ``scheduler.bin``, ``scaler.pt``,
``random_states_<rank>.pkl``, ``dl_state_dict.bin``, ``custom_checkpoint_<i>.pkl``; an ``_<i>`` suffix for
the second and later object of a kind) so tools that know them find their way. Model weights are saved
unwrapped (no ``module.`` prefix), so a checkpoint loads under any number of processes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from drivetrain.checkpoint.files import checkpoint_writer
from drivetrain.checkpoint.serialization import (
    deduplicate_shared,
    load_safetensors_into_module,
    safe_load,
    save_safetensors,
)
from drivetrain.constants import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
)
from drivetrain.errors import CheckpointError
from drivetrain.progress import track

if TYPE_CHECKING:
    from drivetrain.contract.arguments import PreparedObjects

DATALOADER_STATE_NAME = "dl_state_dict"
CUSTOM_OBJECT_NAME = "custom_checkpoint"


def _suffixed(stem: str, index: int, extension: str) -> str:
    return f"{stem}{'' if index == 0 else f'_{index}'}.{extension}"


def model_file_name(index: int, safe_serialization: bool) -> str:
    """``model.safetensors`` / ``model_1.safetensors`` ..., or ``pytorch_model.bin`` / ``pytorch_model_1.bin``."""
    if safe_serialization:
        stem, extension = SAFE_WEIGHTS_NAME.rsplit(".", 1)
        return _suffixed(stem, index, extension)
    return _suffixed(MODEL_NAME, index, WEIGHTS_NAME.rsplit(".", 1)[1])


def optimizer_file_name(index: int) -> str:
    return _suffixed(OPTIMIZER_NAME, index, "bin")


def scheduler_file_name(index: int) -> str:
    return _suffixed(SCHEDULER_NAME, index, "bin")


def dataloader_file_name(index: int) -> str:
    return _suffixed(DATALOADER_STATE_NAME, index, "bin")


def rng_file_name(process_index: int) -> str:
    return f"{RNG_STATE_NAME}_{process_index}.pkl"


def custom_object_file_name(index: int) -> str:
    return f"{CUSTOM_OBJECT_NAME}_{index}.pkl"


def writes_shared_files(accelerator: Any) -> bool:
    """Whether this process writes the files every process shares (weights, optimizer ...): the main
    process, or each machine's local main process with ``save_on_each_node``."""
    config = getattr(accelerator, "project_configuration", None)
    if config is not None and config.save_on_each_node:
        return bool(accelerator.is_local_main_process)
    return bool(accelerator.is_main_process)


def _without_zip_crc() -> contextlib.AbstractContextManager[Any]:
    """torch.save computes a CRC-32 of every record of its zip file: half its time for large tensors. A
    checkpoint's manifest checksums every byte anyway, so its pickles skip it (torch >= 2.6; torch.load and
    Accelerate read such files, Python's ``zipfile`` module refuses their members)."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return contextlib.nullcontext()
    if not hasattr(config, "patch") or not hasattr(config.save, "compute_crc32"):
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": False})


def torch_save_into_checkpoint(obj: Any, path: str) -> None:
    """``torch.save`` of one file of a checkpoint being written (made durable when the save finishes)."""
    with checkpoint_writer(path) as out, _without_zip_crc():
        torch.save(obj, out)


def write_model_weights(state_dict: dict[str, torch.Tensor], path: str, safe_serialization: bool) -> None:
    """One model's weights in one file: safetensors (tied weights stored once) or a pickle."""
    if safe_serialization:
        tensors, _aliases = deduplicate_shared(state_dict)
        save_safetensors(tensors, path, metadata={"format": "pt"})
    else:
        torch_save_into_checkpoint(state_dict, path)


def write_training_objects(
    output_dir: str,
    accelerator: Any,
    weights: list[dict[str, torch.Tensor]],
    optimizers: list,
    schedulers: list,
    safe_serialization: bool,
) -> None:
    """The reference backend's ``save_state``: every model's weights (the state dicts the save_state
    pre-hooks left), optimizer and scheduler, written by the process that writes shared files (all processes
    hold the same replicated state). Takes the ``save_state`` hook's arguments of the same names."""
    if not writes_shared_files(accelerator):
        return
    for index, state_dict in track(list(enumerate(weights)), "checkpoint models", unit="model"):
        path = os.path.join(output_dir, model_file_name(index, safe_serialization))
        write_model_weights(state_dict, path, safe_serialization)
    for index, optimizer in enumerate(optimizers):
        torch_save_into_checkpoint(
            optimizer.state_dict(), os.path.join(output_dir, optimizer_file_name(index))
        )
    for index, scheduler in enumerate(schedulers):
        torch_save_into_checkpoint(
            scheduler.state_dict(), os.path.join(output_dir, scheduler_file_name(index))
        )


def _require(path: str, what: str) -> str:
    if not os.path.isdir(os.path.dirname(path)):
        raise CheckpointError(
            f"checkpoint folder {os.path.dirname(path)} disappeared during the load: another run may have "
            "pruned or replaced it"
        )
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{path} not found: the checkpoint has no {what} (was it saved with the same "
            "number of prepared objects?)"
        )
    return path


def _read_model_source(input_dir: str, index: int, map_location: Any, load_kwargs: dict[str, Any]) -> Any:
    """Model ``index``'s safetensors path (copied in only when applied), else its pickled state dict."""
    safe_path = os.path.join(input_dir, model_file_name(index, True))
    if os.path.isfile(safe_path):
        return safe_path
    path = _require(os.path.join(input_dir, model_file_name(index, False)), f"weights for model {index}")
    return safe_load(path, map_location=map_location, **load_kwargs)


def check_model_source(model: torch.nn.Module, source: Any, where: str) -> None:
    """Raise :class:`CheckpointError` unless ``source`` (a safetensors path or a state dict) fits ``model``
    exactly (names, shapes; tied weights saved once count for every name), before anything is copied."""
    from drivetrain.big_modeling.reader import read_header
    from drivetrain.checkpoint.serialization import _shared_groups

    targets = model.state_dict()
    if isinstance(source, str):
        shapes = {name: tuple(record.shape) for name, record in read_header(source).items()}
    elif isinstance(source, dict):
        shapes = {
            name: tuple(value.shape) for name, value in source.items() if isinstance(value, torch.Tensor)
        }
    else:
        raise CheckpointError(f"{where} holds a {type(source).__name__}, not a state dict")
    groups = _shared_groups(targets)
    unexpected = [name for name in shapes if name not in targets]
    mismatched = [
        f"{name}: checkpoint {shapes[name]}, model {tuple(targets[name].shape)}"
        for name in shapes
        if name in targets
        and isinstance(targets[name], torch.Tensor)
        and shapes[name] != tuple(targets[name].shape)
    ]
    missing = [
        name
        for name, value in targets.items()
        if isinstance(value, torch.Tensor) and not any(other in shapes for other in groups.get(name, [name]))
    ]
    problems = []
    if mismatched:
        problems.append("shape mismatch for " + "; ".join(mismatched[:10]))
    if missing:
        problems.append(f"missing keys {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
    if problems:
        raise CheckpointError(f"cannot load {where} into {type(model).__name__}: " + "; ".join(problems))


def check_optimizer_layout(optimizer: Any, state: Any, where: str) -> None:
    """Raise :class:`CheckpointError` unless the saved optimizer state has this optimizer's parameter groups
    (their number, and the number of parameters in each): what ``load_state_dict`` would refuse, checked
    before anything is applied."""
    inner = getattr(optimizer, "optimizer", optimizer)
    saved_groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(saved_groups, list) or not all(
        isinstance(group, dict) and isinstance(group.get("params"), list) for group in saved_groups
    ):
        raise CheckpointError(f"{where} is not an optimizer state (no list of parameter groups)")
    saved = [len(group["params"]) for group in saved_groups]
    current = [len(group["params"]) for group in inner.param_groups]
    if saved != current:
        raise CheckpointError(
            f"{where} holds {len(saved)} parameter group(s) of {saved} parameters but "
            f"{type(inner).__name__} has {len(current)} of {current}: build the optimizer with the same "
            "parameter groups as the run that saved it"
        )


def _apply_model_source(model: torch.nn.Module, source: Any) -> None:
    if isinstance(source, str):
        load_safetensors_into_module(model, [source])
    else:
        model.load_state_dict(source)


def _model_where(input_dir: str, index: int, source: Any) -> str:
    return source if isinstance(source, str) else os.path.join(input_dir, model_file_name(index, False))


def read_model_weights(
    model: torch.nn.Module, input_dir: str, index: int, map_location: Any, load_kwargs: dict[str, Any]
) -> None:
    """Load model ``index`` of a checkpoint folder, from safetensors when present, else from the pickle."""
    _apply_model_source(model, _read_model_source(input_dir, index, map_location, load_kwargs))


def read_optimizer_state(path: str, map_location: Any, load_kwargs: dict[str, Any]) -> Any:
    """An optimizer file's state dict. Loaded for the CPU, its tensors are views of a private mapping of
    the file rather than copies read into new memory (several times faster: fresh memory costs a page
    fault per page); :func:`apply_optimizer_state` copies them into place."""
    if str(map_location) == "cpu" and "mmap" not in load_kwargs:
        try:
            return safe_load(path, map_location=map_location, mmap=True, **load_kwargs)
        except RuntimeError as exc:
            if isinstance(exc, CheckpointError) or "mmap" not in str(exc):
                raise
            # A file torch cannot map (the legacy, non-zip format): read it as a whole below.
    return safe_load(path, map_location=map_location, **load_kwargs)


def apply_optimizer_state(optimizer: Any, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, with every loaded tensor copied into the optimizer's own
    tensor of the same shape, dtype and device where it has one (no new memory), and cloned otherwise, so
    that nothing keeps a file mapping of :func:`read_optimizer_state` alive."""
    inner = getattr(optimizer, "optimizer", optimizer)
    saved_groups = state.get("param_groups", []) if isinstance(state, dict) else []
    current_groups = inner.param_groups
    same_layout = len(saved_groups) == len(current_groups) and all(
        len(saved["params"]) == len(current["params"]) for saved, current in zip(saved_groups, current_groups)
    )
    if same_layout:
        # The same positional pairing of saved ids and parameters that load_state_dict itself uses.
        parameters = {
            saved_id: parameter
            for saved, current in zip(saved_groups, current_groups)
            for saved_id, parameter in zip(saved["params"], current["params"])
        }
        with torch.no_grad():
            for saved_id, entries in state.get("state", {}).items():
                existing = inner.state.get(parameters.get(saved_id), {})
                for key, value in list(entries.items()):
                    if not isinstance(value, torch.Tensor):
                        continue
                    own = existing.get(key)
                    if (
                        isinstance(own, torch.Tensor)
                        and own.shape == value.shape
                        and own.dtype == value.dtype
                        and own.device == value.device
                    ):
                        entries[key] = own.copy_(value)
                    else:
                        entries[key] = value.clone()
    optimizer.load_state_dict(state)


def read_training_objects(
    input_dir: str,
    accelerator: Any,
    models: list,
    optimizers: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
    verified: Callable[..., None],
) -> None:
    """The reference backend's ``load_state``: every model, optimizer and scheduler, on every process. Takes
    the ``load_state`` hook's arguments of the same names.

    Everything is read first (pickles into memory; safetensors weights are copied straight into the model
    later), while ``load_state`` checks the files' hashes; nothing is applied before ``verified()`` says
    every file matched on every process, so a damaged checkpoint leaves the training objects untouched."""
    try:
        model_sources = [
            _read_model_source(input_dir, index, map_location, load_kwargs) for index in range(len(models))
        ]
        optimizer_states = [
            read_optimizer_state(
                _require(os.path.join(input_dir, optimizer_file_name(index)), f"state for optimizer {index}"),
                map_location,
                load_kwargs,
            )
            for index in range(len(optimizers))
        ]
        scheduler_states = [
            safe_load(
                _require(os.path.join(input_dir, scheduler_file_name(index)), f"state for scheduler {index}"),
                map_location=map_location,
                **load_kwargs,
            )
            for index in range(len(schedulers))
        ]
        # Everything that can be checked is, before anything is applied: a failure leaves all untouched.
        for index, (model, source) in enumerate(zip(models, model_sources)):
            check_model_source(
                accelerator.unwrap_model(model), source, _model_where(input_dir, index, source)
            )
        for index, (optimizer, state) in enumerate(zip(optimizers, optimizer_states)):
            check_optimizer_layout(optimizer, state, os.path.join(input_dir, optimizer_file_name(index)))
    except Exception as exc:
        verified(exc)
        raise
    verified()
    for model, source in track(list(zip(models, model_sources)), "checkpoint models", unit="model"):
        _apply_model_source(accelerator.unwrap_model(model), source)
    for optimizer, state in zip(optimizers, optimizer_states):
        apply_optimizer_state(optimizer, state)
    for scheduler, state in zip(schedulers, scheduler_states):
        scheduler.load_state_dict(state)


def write_kernel_objects(output_dir: str, accelerator: Any, prepared: PreparedObjects) -> None:
    """What the kernel saves beside the backend's files: every process's RNG states, and (once) the
    GradScaler, each prepared data loader's position and each registered object."""
    from drivetrain.operations.random import capture_rng_state

    torch_save_into_checkpoint(
        capture_rng_state(), os.path.join(output_dir, rng_file_name(accelerator.process_index))
    )
    if not writes_shared_files(accelerator):
        return
    if accelerator.scaler is not None:
        torch_save_into_checkpoint(accelerator.scaler.state_dict(), os.path.join(output_dir, SCALER_NAME))
    for index, loader in enumerate(prepared.dataloaders):
        # A prepared loader's resume record (its state_dict() is torchdata's alone when it is stateful).
        state = getattr(loader, "resume_state", None) or getattr(loader, "state_dict", None)
        if callable(state):
            torch_save_into_checkpoint(state(), os.path.join(output_dir, dataloader_file_name(index)))
    for index, obj in enumerate(prepared.custom_objects):
        torch_save_into_checkpoint(obj.state_dict(), os.path.join(output_dir, custom_object_file_name(index)))


def read_kernel_objects(
    input_dir: str,
    accelerator: Any,
    prepared: PreparedObjects,
    map_location: Any,
    load_kwargs: dict[str, Any],
) -> Callable[[], None]:
    """Read what :func:`write_kernel_objects` saved and return the function that applies it: every file is
    read (and refused if it must be) before anything changes. A data loader whose state is absent (the
    checkpoint predates it) starts from its beginning, as in Accelerate; every other missing file is an
    error."""
    from drivetrain.operations.random import restore_rng_state

    steps: list[Callable[[], None]] = []

    def later(target: Callable[[Any], Any], value: Any) -> None:
        steps.append(lambda: target(value))

    if accelerator.scaler is not None:
        path = _require(os.path.join(input_dir, SCALER_NAME), "GradScaler state")
        later(accelerator.scaler.load_state_dict, safe_load(path, map_location=map_location, **load_kwargs))
    for index, loader in enumerate(prepared.dataloaders):
        path = os.path.join(input_dir, dataloader_file_name(index))
        load = getattr(loader, "load_resume_state", None) or getattr(loader, "load_state_dict", None)
        if os.path.isfile(path) and callable(load):
            later(load, safe_load(path, map_location="cpu", **load_kwargs))
    for index, obj in enumerate(prepared.custom_objects):
        path = _require(os.path.join(input_dir, custom_object_file_name(index)), f"registered object {index}")
        later(obj.load_state_dict, safe_load(path, map_location=map_location, **load_kwargs))
    rng_path = os.path.join(input_dir, rng_file_name(accelerator.process_index))
    if os.path.isfile(rng_path):
        later(restore_rng_state, safe_load(rng_path, map_location="cpu", **load_kwargs))
    else:
        # Resuming under more processes than saved: the extra ranks keep their seeded state.
        import warnings

        warnings.warn(
            f"{rng_path} not found: process {accelerator.process_index} keeps its current RNG state",
            stacklevel=3,
        )

    def apply() -> None:
        for step in steps:
            step()

    return apply
