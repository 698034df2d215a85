"""Which file holds which training object inside a checkpoint folder, and how each is written and read.

The names are Accelerate's (``model.safetensors``, ``optimizer.bin``, ``scheduler.bin``, ``scaler.pt``,
``random_states_<rank>.pkl``, ``dl_state_dict.bin``, ``custom_checkpoint_<i>.pkl``; an ``_<i>`` suffix for
the second and later object of a kind) so tools that know them find their way. Model weights are saved
unwrapped (no ``module.`` prefix), so a checkpoint loads under any number of processes.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from drivetrain.checkpoint.files import checkpoint_writer
from drivetrain.checkpoint.manifest import checkpoint_path
from drivetrain.checkpoint.serialization import (
    deduplicate_shared,
    load_safetensors_into_module,
    safe_load,
    save_safetensors,
)
from drivetrain.checkpoint.state_checks import (
    check_model_source,
    check_optimizer_layout,
    check_scheduler_state,
    check_state_layout,
    try_loading,
    try_rng_state,
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


def _require(input_dir: str, name: str, what: str) -> str:
    """The path of ``name`` in the checkpoint, or a :class:`CheckpointError` saying which object lacks it."""
    if not os.path.isdir(input_dir):
        raise CheckpointError(
            f"checkpoint folder {input_dir} disappeared during the load: another run may have "
            "pruned or replaced it"
        )
    path = checkpoint_path(input_dir, name)
    if path is None or not os.path.isfile(path):
        raise CheckpointError(
            f"{os.path.join(input_dir, name)} not found: the checkpoint has no {what} (was it saved with the "
            "same number of prepared objects?)"
        )
    return path


def _present(input_dir: str, name: str) -> str | None:
    """The path of ``name`` if the checkpoint holds that file (listed in its manifest when it has one)."""
    path = checkpoint_path(input_dir, name)
    return path if path is not None and os.path.isfile(path) else None


def _read_model_source(input_dir: str, index: int, map_location: Any, load_kwargs: dict[str, Any]) -> Any:
    """Model ``index``'s safetensors path (copied in only when applied), else its pickled state dict."""
    safe_path = _present(input_dir, model_file_name(index, True))
    if safe_path is not None:
        return safe_path
    path = _require(input_dir, model_file_name(index, False), f"weights for model {index}")
    return safe_load(path, map_location=map_location, **load_kwargs)


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
                _require(input_dir, optimizer_file_name(index), f"state for optimizer {index}"),
                map_location,
                load_kwargs,
            )
            for index in range(len(optimizers))
        ]
        scheduler_states = read_scheduler_states(input_dir, schedulers, map_location, load_kwargs)
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


def read_scheduler_state(
    input_dir: str, index: int, scheduler: Any, map_location: Any, load_kwargs: dict[str, Any]
) -> Any:
    """Scheduler ``index``'s saved state (``scheduler.bin``, ``scheduler_1.bin`` ...), read and checked
    against ``scheduler`` (:func:`~drivetrain.checkpoint.state_checks.check_scheduler_state`) so that
    applying it cannot fail: a backend's ``load_state`` reads them before it changes anything."""
    path = _require(input_dir, scheduler_file_name(index), f"state for scheduler {index}")
    state = safe_load(path, map_location=map_location, **load_kwargs)
    check_scheduler_state(scheduler, state, path)
    return state


def read_scheduler_states(
    input_dir: str, schedulers: list, map_location: Any, load_kwargs: dict[str, Any]
) -> list[Any]:
    """:func:`read_scheduler_state` of every scheduler, in order."""
    return [
        read_scheduler_state(input_dir, index, scheduler, map_location, load_kwargs)
        for index, scheduler in enumerate(schedulers)
    ]


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


class KernelObjects:
    """What :func:`write_kernel_objects` saved, read back by :func:`read_kernel_objects`: :meth:`check`
    finishes checking it (trying what only the objects themselves can judge, and putting them back), then
    :meth:`apply` restores it, which can no longer fail."""

    def __init__(self) -> None:
        self._checks: list[Callable[[], None]] = []
        self._steps: list[Callable[[], None]] = []

    def add(self, apply: Callable[[Any], Any], value: Any, check: Callable[[], None] | None = None) -> None:
        if check is not None:
            self._checks.append(check)
        self._steps.append(lambda: apply(value))

    def check(self) -> None:
        for check in self._checks:
            check()

    def apply(self) -> None:
        for step in self._steps:
            step()


def read_kernel_objects(
    input_dir: str,
    accelerator: Any,
    prepared: PreparedObjects,
    map_location: Any,
    load_kwargs: dict[str, Any],
) -> KernelObjects:
    """Read what :func:`write_kernel_objects` saved and check what can be checked from the files alone;
    every file is read (and refused if it must be) before anything changes. A data loader whose state is
    absent (the checkpoint predates it) starts from its beginning, as in Accelerate; every other missing
    file is an error."""
    from drivetrain.operations.random import restore_rng_state

    objects = KernelObjects()
    if accelerator.scaler is not None:
        path = _require(input_dir, SCALER_NAME, "GradScaler state")
        state = safe_load(path, map_location=map_location, **load_kwargs)
        live = accelerator.scaler.state_dict()
        if live:  # a disabled scaler has no state and loads none
            check_state_layout(live, state, path, type(accelerator.scaler).__name__)
        objects.add(accelerator.scaler.load_state_dict, state)
    for index, loader in enumerate(prepared.dataloaders):
        load = getattr(loader, "load_resume_state", None) or getattr(loader, "load_state_dict", None)
        loader_path = _present(input_dir, dataloader_file_name(index))
        if loader_path is None or not callable(load):
            continue
        state = safe_load(loader_path, map_location="cpu", **load_kwargs)
        check = getattr(loader, "check_resume_state", None)
        if callable(check):
            try:
                check(state)
            except CheckpointError as exc:
                raise CheckpointError(f"{loader_path}: {exc}") from None
        objects.add(load, state)
    for index, obj in enumerate(prepared.custom_objects):
        path = _require(input_dir, custom_object_file_name(index), f"registered object {index}")
        state = safe_load(path, map_location=map_location, **load_kwargs)
        objects.add(obj.load_state_dict, state, functools.partial(try_loading, obj, state, path))
    rng_path = _present(input_dir, rng_file_name(accelerator.process_index))
    if rng_path is not None:
        state = safe_load(rng_path, map_location="cpu", **load_kwargs)
        if not isinstance(state, dict):
            raise CheckpointError(f"{rng_path} holds a {type(state).__name__}, not random generator states")
        objects.add(restore_rng_state, state, functools.partial(try_rng_state, state, rng_path))
    else:
        # Resuming under more processes than saved: the extra ranks keep their seeded state.
        import warnings

        warnings.warn(
            f"{os.path.join(input_dir, rng_file_name(accelerator.process_index))} not found: process "
            f"{accelerator.process_index} keeps its current RNG state",
            stacklevel=3,
        )
    return objects
