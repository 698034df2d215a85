"""Kwargs handlers: small attrs classes that customise one torch object the Accelerator builds.

Only the fields a user changed reach torch (``to_kwargs()``), so torch's own defaults stay in charge of
everything else. Backend-specific handlers (``DistributedDataParallelKwargs``, ``FP8RecipeKwargs``) live in
their plugins and subclass :class:`KwargsHandler` too.
"""

from __future__ import annotations

import datetime
from typing import Any

import attrs

from drivetrain.errors import ConfigurationError


@attrs.define
class KwargsHandler:
    """Base class: ``to_kwargs()`` returns the fields whose value differs from the default."""

    def to_kwargs(self) -> dict[str, Any]:
        changed = {}
        for field in attrs.fields(type(self)):
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()  # type: ignore[call-arg]
            value = getattr(self, field.name)
            if value != default:
                changed[field.name] = value
        return changed


def _positive(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and value <= 0:
        raise ConfigurationError(f"{type(instance).__name__}.{attribute.name} must be > 0, got {value!r}")


@attrs.define
class AutocastKwargs(KwargsHandler):
    """Options for ``torch.autocast`` in ``Accelerator.autocast`` and around prepared models."""

    enabled: bool = True
    cache_enabled: bool | None = None


@attrs.define
class GradScalerKwargs(KwargsHandler):
    """Options for the ``torch.amp.GradScaler`` built for fp16 training."""

    init_scale: float = attrs.field(default=65536.0, validator=_positive)
    growth_factor: float = attrs.field(default=2.0, validator=_positive)
    backoff_factor: float = attrs.field(default=0.5, validator=_positive)
    growth_interval: int = attrs.field(default=2000, validator=_positive)
    enabled: bool = True


def _to_timedelta(value: Any) -> datetime.timedelta | None:
    if value is None or isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, (int, float)):
        return datetime.timedelta(seconds=value)
    raise ConfigurationError(f"InitProcessGroupKwargs.timeout must be a timedelta or seconds, got {value!r}")


@attrs.define
class InitProcessGroupKwargs(KwargsHandler):
    """Options for ``torch.distributed.init_process_group`` (used by the distribution backend)."""

    backend: str | None = None
    init_method: str | None = None
    timeout: datetime.timedelta | None = attrs.field(default=None, converter=_to_timedelta)


# Handlers that live in their own modules or in plugins, importable from here as in Accelerate.
_ELSEWHERE = {"ProfileKwargs": "drivetrain.profiling"}


def __getattr__(name: str) -> Any:
    from drivetrain._lazy import lazy_getattr

    return lazy_getattr(__name__, {key: f"{module}:{key}" for key, module in _ELSEWHERE.items()}, name)
