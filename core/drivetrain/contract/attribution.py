"""Naming the plugin on an error raised inside one of its hooks, without changing the error's type.

Callers catch out-of-memory and other specific types, so the exception itself is re-raised untouched, with a
note ``raised in hook 'wrap_model' of drivetrain plugin 'fsdp'``. The plugin is found afterwards, from the
traceback (the frame of one of the hook's implementations), so that a hook call costs nothing extra.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable
from typing import Any


def add_note(exc: BaseException, note: str) -> None:
    if note in getattr(exc, "__notes__", ()):
        return
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10 has no add_note
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def attribute(exc: BaseException, hook: str, implementations: Iterable[Any]) -> None:
    """Add the note naming the plugin whose implementation of ``hook`` (pluggy ``HookImpl`` objects) the
    traceback of ``exc`` passes through; nothing when the error arose outside every implementation."""
    plugins = {}
    for implementation in implementations:
        code = getattr(inspect.unwrap(implementation.function), "__code__", None)
        if code is not None:
            plugins[code] = implementation.plugin_name
    frame = exc.__traceback__
    while frame is not None:
        plugin = plugins.get(frame.tb_frame.f_code)
        if plugin is not None:
            add_note(exc, f"raised in hook {hook!r} of drivetrain plugin {plugin!r}")
            return
        frame = frame.tb_next
