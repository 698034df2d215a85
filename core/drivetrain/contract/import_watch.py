"""What a plugin's import may leave behind in the importing process, undone or named.

The manager imports a plugin module with a time limit and catches whatever it raises (registry.py). Two
more things a module can do while importing hurt every command and script of the process later:

- **close ``sys.stdout`` / ``sys.stderr``**: every later ``print`` fails ("I/O operation on closed
  file"). The stream is put back (a closed standard stream is opened again on its file descriptor, which
  Python never closes with it) and the plugin is named in a warning.
- **start a thread that is not a daemon**: Python waits for it before the process can end, so a finished
  script would never exit. Threads a module starts while imported on the manager's helper thread are
  daemons unless it asks otherwise (a new thread inherits the flag of the thread that starts it); one
  that still asks for ``daemon=False`` cannot be changed once started, so it is named in a warning: the
  user learns which plugin keeps the process alive.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import warnings
from collections.abc import Iterator

_STREAMS = (("stdout", 1), ("stderr", 2))


@contextlib.contextmanager
def watch_import(name: str, distribution: str) -> Iterator[None]:
    """Around the import (and registration) of plugin ``name``: restore the standard streams and name
    the non-daemon threads it started, in warnings."""
    streams = {attribute: getattr(sys, attribute) for attribute, _ in _STREAMS}
    threads = set(threading.enumerate())
    try:
        yield
    finally:
        problems = _restore_streams(streams)
        started = [
            thread
            for thread in threading.enumerate()
            if thread not in threads and not thread.daemon and thread.is_alive()
        ]
        if started:
            names = ", ".join(repr(thread.name) for thread in started)
            problems.append(
                f"started thread(s) {names} that are not daemons, so this process cannot end before they "
                "do (a script that finished may seem to hang)"
            )
        for problem in problems:
            warnings.warn(
                f"drivetrain: plugin {name!r} (distribution {distribution}) {problem}",
                RuntimeWarning,
                stacklevel=4,
            )


def _restore_streams(saved: dict[str, object]) -> list[str]:
    """Put back a standard stream the import left closed (one it merely replaced, as colorama does, works
    and is left alone)."""
    problems = []
    for attribute, descriptor in _STREAMS:
        current = getattr(sys, attribute)
        if current is None or not getattr(current, "closed", False):
            continue
        original = saved[attribute]
        usable = original is not current and not getattr(original, "closed", True)
        replacement = original if usable else _reopen(original, descriptor)
        if replacement is None:
            problems.append(f"closed sys.{attribute} while importing, and it could not be opened again")
            continue
        setattr(sys, attribute, replacement)
        problems.append(f"closed sys.{attribute} while importing; it was opened again")
    return problems


def _reopen(original: object, descriptor: int) -> io.TextIOWrapper | None:
    """A text stream on ``descriptor`` like ``original`` (only for the process's own standard streams:
    another object, such as a test's capture, has no descriptor to reopen)."""
    if original is not getattr(sys, f"__{'stdout' if descriptor == 1 else 'stderr'}__"):
        return None
    try:
        return io.TextIOWrapper(
            io.FileIO(descriptor, "w", closefd=False),
            encoding=getattr(original, "encoding", None) or "utf-8",
            errors=getattr(original, "errors", None) or "strict",
            line_buffering=bool(getattr(original, "line_buffering", False)),
            write_through=True,
        )
    except OSError:
        return None
