"""``Accelerator.profile()``: torch.profiler around a block, configured by :class:`ProfileKwargs`, with one
Chrome trace per process when ``output_trace_dir`` is set."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch

from drivetrain.errors import ConfigurationError
from drivetrain.kwargs_handlers import KwargsHandler

#: File name of each process's Chrome trace inside ``output_trace_dir``.
TRACE_FILE_PATTERN = "profile_{process_index}.json"


def _activity_names() -> dict[str, Any]:
    """``"cpu"`` -> ``ProfilerActivity.CPU`` ... for the activities this torch build knows."""
    return {name.lower(): member for name, member in torch.profiler.ProfilerActivity.__members__.items()}


def _check_activities(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
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


def _schedule_keys() -> tuple[set[str], set[str]]:
    """(all keyword arguments, required ones) of ``torch.profiler.schedule``."""
    parameters = inspect.signature(torch.profiler.schedule).parameters
    required = {name for name, p in parameters.items() if p.default is inspect.Parameter.empty}
    return set(parameters), required


def _check_schedule(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
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


def _check_callable(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not callable(value):
        raise ConfigurationError(f"ProfileKwargs.{attribute.name} must be callable, got {value!r}")


@attrs.define
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

    activities: list[str] | None = attrs.field(default=None, validator=_check_activities)
    schedule_option: dict[str, int] | None = attrs.field(default=None, validator=_check_schedule)
    on_trace_ready: Callable | None = attrs.field(default=None, validator=_check_callable)
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = attrs.field(
        default=None, converter=lambda v: None if v is None else os.fspath(v)
    )

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


def trace_path(output_trace_dir: str, process_index: int) -> str:
    return os.path.join(output_trace_dir, TRACE_FILE_PATTERN.format(process_index=process_index))


class ProfilingMixin:
    """``Accelerator.profile()``. Uses the ``ProfileKwargs`` given in the Accelerator's ``kwargs_handlers``
    when ``profile()`` gets none."""

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[torch.profiler.profile]:
        """Profile the block with torch.profiler; yields the profiler (``prof.step()``,
        ``prof.key_averages()``). With ``output_trace_dir`` set, every process writes its Chrome trace to
        ``output_trace_dir/profile_<process_index>.json`` and the processes meet before the block ends."""
        handler = profile_handler or self._handler(ProfileKwargs) or ProfileKwargs()  # type: ignore[attr-defined]
        if not isinstance(handler, ProfileKwargs):
            raise TypeError(f"Accelerator.profile expects a ProfileKwargs, got {type(handler).__name__}")
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        profiler.export_chrome_trace(trace_path(handler.output_trace_dir, self.process_index))  # type: ignore[attr-defined]
        self.wait_for_everyone()  # type: ignore[attr-defined]
