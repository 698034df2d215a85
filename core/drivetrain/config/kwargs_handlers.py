"""Kwargs handlers: small dataclasses that customise one torch object the Accelerator builds.

Only the fields a user changed reach torch (``to_kwargs()``), so torch's own defaults stay in charge of
everything else. Backend-specific handlers (``DistributedDataParallelKwargs``, ``FP8RecipeKwargs``) live in
their plugins and subclass :class:`KwargsHandler` too.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch

from drivetrain.config.fields import Checked, checked
from drivetrain.errors import ConfigurationError


@dataclasses.dataclass
class KwargsHandler(Checked):
    """Base class: ``to_kwargs()`` returns the fields whose value differs from the default."""

    def to_kwargs(self) -> dict[str, Any]:
        changed = {}
        for name, default in _field_defaults(type(self)):
            value = getattr(self, name)
            if value != default:
                changed[name] = value
        return changed


def _field_defaults(cls: type) -> list[tuple[str, Any]]:
    """(name, default) of each field: ours and users' (as Accelerate's docs show) are ``@dataclass``es, a
    plugin's may be an attrs class; the nearest class in the MRO that declares fields decides. A field without a
    default has none to differ from (MISSING)."""
    declaring = next(
        (
            klass
            for klass in cls.__mro__
            if "__attrs_attrs__" in vars(klass) or "__dataclass_fields__" in vars(klass)
        ),
        object,
    )
    if "__attrs_attrs__" in vars(declaring):
        import attrs  # only a plugin's attrs class gets here, and its plugin depends on attrs

        fields = []
        for field in attrs.fields(cls):
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()  # type: ignore[call-arg]
            fields.append((field.name, default))
        return fields
    if dataclasses.is_dataclass(declaring):
        return [
            (
                field.name,
                field.default_factory()
                if field.default_factory is not dataclasses.MISSING
                else field.default,
            )
            for field in dataclasses.fields(cls)
        ]
    return []


def _positive(instance: Any, name: str, value: Any) -> Any:
    if value is not None and value <= 0:
        raise ConfigurationError(f"{type(instance).__name__}.{name} must be > 0, got {value!r}")
    return value


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """Options for ``torch.autocast`` in ``Accelerator.autocast`` and around prepared models."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Options for the ``torch.amp.GradScaler`` built for fp16 training."""

    init_scale: float = checked(65536.0, _positive)
    growth_factor: float = checked(2.0, _positive)
    backoff_factor: float = checked(0.5, _positive)
    growth_interval: int = checked(2000, _positive)
    enabled: bool = True


def _to_timedelta(instance: Any, name: str, value: Any) -> datetime.timedelta | None:
    if value is None or isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, (int, float)):
        return datetime.timedelta(seconds=value)
    raise ConfigurationError(f"InitProcessGroupKwargs.timeout must be a timedelta or seconds, got {value!r}")


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Options for ``torch.distributed.init_process_group`` (used by the distribution backend)."""

    backend: str | None = None
    init_method: str | None = None
    timeout: datetime.timedelta | None = checked(None, _to_timedelta)


# -- the profiler -------------------------------------------------------------------------------------------
def _activity_names() -> dict[str, Any]:
    """``"cpu"`` -> ``ProfilerActivity.CPU`` ... for the activities this torch build knows."""
    return {name.lower(): member for name, member in torch.profiler.ProfilerActivity.__members__.items()}


def _check_activities(instance: Any, name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigurationError(
            f"ProfileKwargs.activities must be a list such as ['cpu', 'cuda'], got {value!r}"
        )
    known = _activity_names()
    for activity in value:
        if str(activity).lower() not in known:
            raise ConfigurationError(
                f"ProfileKwargs.activities: unknown activity {activity!r}; this torch knows {', '.join(known)}"
            )
    return value


def _schedule_keys() -> tuple[set[str], set[str]]:
    """(all keyword arguments, required ones) of ``torch.profiler.schedule``."""
    parameters = inspect.signature(torch.profiler.schedule).parameters
    required = {name for name, p in parameters.items() if p.default is inspect.Parameter.empty}
    return set(parameters), required


def _check_schedule(instance: Any, field: str, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigurationError(f"ProfileKwargs.schedule_option must be a dict, got {type(value).__name__}")
    allowed, required = _schedule_keys()
    unknown = set(value) - allowed
    if unknown:
        raise ConfigurationError(
            f"ProfileKwargs.schedule_option: unknown key(s) {', '.join(sorted(unknown))}; "
            f"valid keys: {', '.join(sorted(allowed))}"
        )
    missing = required - set(value)
    if missing:
        raise ConfigurationError(f"ProfileKwargs.schedule_option needs {', '.join(sorted(missing))} as well")
    for key, number in value.items():
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise ConfigurationError(
                f"ProfileKwargs.schedule_option[{key!r}] must be an int >= 0, got {number!r}"
            )
    return value


def _check_callable(instance: Any, name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise ConfigurationError(f"ProfileKwargs.{name} must be callable, got {value!r}")
    return value


def _optional_path(instance: Any, name: str, value: Any) -> str | None:
    return None if value is None else os.fspath(value)


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """Options for ``torch.profiler.profile`` used by ``Accelerator.profile()``.

    :param activities: which activities to record: ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"mtia"``, ``"hpu"``
        (default: torch's choice, CPU plus the accelerator present).
    :param schedule_option: keyword arguments of ``torch.profiler.schedule`` (``wait``, ``warmup``,
        ``active``, ``repeat``, ``skip_first``); call ``prof.step()`` once per step.
    :param on_trace_ready: called with the profiler each time a scheduled trace is ready.
    :param record_shapes: record operator input shapes.
    :param profile_memory: record tensor memory allocation and release.
    :param with_stack: record source locations.
    :param with_flops: estimate FLOPs of matrix multiplications and convolutions.
    :param with_modules: record the module hierarchy.
    :param output_trace_dir: write each process's Chrome trace to ``<dir>/profile_<process_index>.json``
        when the block ends.
    """

    activities: list[str] | None = checked(None, _check_activities)
    schedule_option: dict[str, int] | None = checked(None, _check_schedule)
    on_trace_ready: Callable | None = checked(None, _check_callable)
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = checked(None, _optional_path)

    def build(self) -> torch.profiler.profile:
        """The ``torch.profiler.profile`` these options describe (not yet started)."""
        activities = None
        if self.activities is not None:
            known = _activity_names()
            activities = [known[str(activity).lower()] for activity in self.activities]
        schedule = (
            torch.profiler.schedule(**self.schedule_option) if self.schedule_option is not None else None
        )
        return torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )
