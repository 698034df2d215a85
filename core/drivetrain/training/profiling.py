"""``Accelerator.profile()``: torch.profiler around a block, configured by :class:`ProfileKwargs`, with one
Chrome trace per process when ``output_trace_dir`` is set."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from drivetrain.config.kwargs_handlers import ProfileKwargs

#: File name of each process's Chrome trace inside ``output_trace_dir``.
TRACE_FILE_PATTERN = "profile_{process_index}.json"


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
