"""Configuration objects users pass to the Accelerator. Bad values fail when the object is built or the field
assigned, naming the field and what is allowed."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from drivetrain.config.enums import DynamoBackend
from drivetrain.config.fields import Checked, checked
from drivetrain.config.sources import env_flag
from drivetrain.errors import ConfigurationError


def _non_negative_int_or_none(instance: Any, name: str, value: Any) -> Any:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigurationError(
            f"{type(instance).__name__}.{name} must be a non-negative integer or None, got {value!r}"
        )
    return value


def _positive_int_or_none(instance: Any, name: str, value: Any) -> Any:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigurationError(f"{type(instance).__name__}.{name} must be an integer >= 1, got {value!r}")
    return value


def _bool(instance: Any, name: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{type(instance).__name__}.{name} must be True or False, got {value!r}")
    return value


def _bool_or_none_is_false(instance: Any, name: str, value: Any) -> Any:
    # None is Accelerate's "not given" (transformers passes it); its __post_init__ then reads the variable.
    return False if value is None else _bool(instance, name, value)


def _optional_bool(instance: Any, name: str, value: Any) -> Any:
    return value if value is None else _bool(instance, name, value)


def _optional_path(instance: Any, name: str, value: Any) -> str | None:
    return None if value is None else os.fspath(value)


@dataclasses.dataclass
class ProjectConfiguration(Checked):
    """Where a run writes its checkpoints and logs, and how checkpoints are named and pruned.

    :param project_dir: root folder of the run; checkpoints go to ``project_dir/checkpoints``.
    :param logging_dir: folder for tracker logs (defaults to ``project_dir``).
    :param automatic_checkpoint_naming: ``save_state()`` writes ``checkpoints/checkpoint_<iteration>``.
    :param total_limit: keep at most this many automatic checkpoints (the oldest are deleted).
    :param iteration: number of the next automatic checkpoint.
    :param save_on_each_node: every machine writes its own copy (for storage that is not shared).
    :param async_save: drivetrain's opt-in: ``save_state`` returns once the checkpoint's files are written
        and finishes it (fsync, manifest, rename, pruning) in the background. By default (``False``), as in
        Accelerate, ``save_state`` returns when the checkpoint is complete under its final name.
    :param checkpoint_sha256: drivetrain's opt-in: checkpoint manifests record a sha256 of every piece of
        every file besides the xxh3-128 checksums a load checks (for ``load_state(verify_manifest="sha256")``
        and checks with standard tools). Costs about a second of a core's time per 1.5 GB saved.
    """

    project_dir: str | None = checked(None, _optional_path)
    logging_dir: str | None = checked(None, _optional_path)
    automatic_checkpoint_naming: bool = checked(False, _bool)
    total_limit: int | None = checked(None, _positive_int_or_none)
    iteration: int = checked(0, _non_negative_int_or_none)
    save_on_each_node: bool = checked(False, _bool)
    async_save: bool = checked(False, _bool)
    checkpoint_sha256: bool = checked(False, _bool)

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    def set_directories(self, project_dir: str | None = None) -> None:
        """Point ``project_dir`` (and ``logging_dir`` when unset) at ``project_dir``."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


@dataclasses.dataclass
class DataLoaderConfiguration(Checked):
    """How prepared data loaders split and deliver batches (see docs/data-loading.md).

    :param split_batches: the loader's batch size is the global batch; each process gets a slice of it.
    :param dispatch_batches: process 0 reads every batch and sends each process its part (default: on for
        iterable datasets).
    :param even_batches: pad the last batch by wrapping around so every process gets the same count.
    :param use_seedable_sampler: shuffle with a sampler seeded per epoch (reproducible across runs).
    :param data_seed: seed of that sampler's generator.
    :param non_blocking: move batches to the device asynchronously (with pinned memory).
    :param use_stateful_dataloader: build loaders on torchdata's StatefulDataLoader (resume mid-epoch).
    """

    split_batches: bool = checked(False, _bool)
    dispatch_batches: bool | None = checked(None, _optional_bool)
    even_batches: bool = checked(True, _bool)
    use_seedable_sampler: bool = checked(False, _bool)
    data_seed: int | None = checked(None, _non_negative_int_or_none)
    non_blocking: bool = checked(False, _bool)
    use_stateful_dataloader: bool = checked(False, _bool)


@dataclasses.dataclass
class GradientAccumulationPlugin(Checked):
    """How gradient accumulation behaves.

    :param num_steps: batches per optimizer step.
    :param adjust_scheduler: count accumulation steps in the scheduler so its schedule is in optimizer steps.
    :param sync_with_dataloader: force a sync (and step) at the end of the data loader.
    :param sync_each_batch: synchronise gradients on every batch (less memory, more communication).
    """

    num_steps: int | None = checked(None, _positive_int_or_none)
    adjust_scheduler: bool = checked(True, _bool)
    sync_with_dataloader: bool = checked(True, _bool)
    sync_each_batch: bool = checked(False, _bool)


def _dynamo_backend(instance: Any, name: str, value: Any) -> DynamoBackend:
    if isinstance(value, DynamoBackend):
        return value
    if (
        value is None
    ):  # Accelerate's reading of None (transformers passes it): the launcher's variable, or off
        value = os.environ.get("ACCELERATE_DYNAMO_BACKEND") or DynamoBackend.NO.value
    text = str(value).upper()
    try:
        return DynamoBackend(text)
    except ValueError:
        raise ConfigurationError(
            f"TorchDynamoPlugin.backend={value!r} is not valid; choose one of: {', '.join(DynamoBackend.list())}"
        ) from None


_COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _compile_mode(instance: Any, name: str, value: Any) -> str | None:
    if value not in _COMPILE_MODES:
        raise ConfigurationError(
            f"TorchDynamoPlugin.mode={value!r} is not valid; choose one of: {', '.join(map(str, _COMPILE_MODES))}"
        )
    return value


@dataclasses.dataclass
class TorchDynamoPlugin(Checked):
    """Compile prepared models with ``torch.compile``.

    :param backend: a :class:`~drivetrain.config.enums.DynamoBackend` (``"inductor"``, ``"eager"``, ...); ``"no"``
        disables compilation; ``None`` (as Accelerate reads it) is ``ACCELERATE_DYNAMO_BACKEND``, else ``"no"``.
    :param mode: torch.compile mode.
    :param fullgraph: fail instead of falling back on graph breaks (``None``: ``ACCELERATE_DYNAMO_USE_FULLGRAPH``).
    :param dynamic: use dynamic shapes.
    :param options: backend options.
    :param disable: turn compilation off while keeping the settings.
    """

    backend: DynamoBackend = checked(DynamoBackend.NO, _dynamo_backend)
    mode: str | None = checked(None, _compile_mode)
    fullgraph: bool = checked(False, _bool_or_none_is_false)
    dynamic: bool | None = checked(None, _optional_bool)
    options: dict[str, Any] | None = None
    disable: bool = checked(False, _bool)

    def __post_init__(self) -> None:
        # Accelerate's ACCELERATE_DYNAMO_* variables (``accelerate launch --dynamo_*`` sets them) fill the
        # settings left at their defaults
        import os

        backend = os.environ.get("ACCELERATE_DYNAMO_BACKEND")
        if self.backend == DynamoBackend.NO and backend:
            self.backend = _dynamo_backend(self, "backend", backend)
        mode = os.environ.get("ACCELERATE_DYNAMO_MODE")
        if self.mode is None and mode:
            self.mode = mode if mode in _COMPILE_MODES else self.mode
        if not self.fullgraph and env_flag("ACCELERATE_DYNAMO_USE_FULLGRAPH"):
            self.fullgraph = True
        if self.dynamic is None and os.environ.get("ACCELERATE_DYNAMO_USE_DYNAMIC", "").strip():
            self.dynamic = env_flag("ACCELERATE_DYNAMO_USE_DYNAMIC")

    @property
    def enabled(self) -> bool:
        return self.backend != DynamoBackend.NO and not self.disable

    def to_dict(self) -> dict[str, Any]:
        """The settings, the backend as its lower-case name (``"inductor"``), as Accelerate writes them."""
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        values["backend"] = self.backend.value.lower()
        return values

    def to_kwargs(self) -> dict[str, Any]:
        """The settings that differ from the defaults (Accelerate's ``KwargsHandler.to_kwargs``); defaults are
        taken with the ``ACCELERATE_DYNAMO_*`` variables cleared."""
        from drivetrain.config.environment_variables import clear_environment

        with clear_environment():
            defaults = type(self)().to_dict()
        return {key: value for key, value in self.to_dict().items() if defaults[key] != value}

    def to_compile_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"backend": self.backend.value.lower()}
        for name in ("mode", "dynamic", "options"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        if self.fullgraph:
            kwargs["fullgraph"] = True
        return kwargs
