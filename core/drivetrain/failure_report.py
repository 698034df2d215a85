"""Which process of a launched job failed first, and one traceback on the terminal rather than one per rank.

torch's launcher orders failures by a timestamp in whole seconds, taken when it noticed them: when one rank
raises and the others then fail waiting for it (or are stopped), it often names the wrong rank, and says
nothing of the error. So a process started by ``drivetrain launch`` whose script ends with an uncaught
exception reports it to the launcher first (its rank, the error in one line, the traceback; see
launch_channel.py), and the launcher names the first one that arrived.

Only the first failure of a job is printed: when rank 0 raises, rank 1's collective fails with
"Connection closed by peer", a traceback about rank 0 rather than a second problem; and when the launcher
is stopped (Ctrl-C), it forwards SIGINT, which would print one KeyboardInterrupt traceback per rank. Those
tracebacks go to the launcher's failure report (``drivetrain launch --debug`` prints it) instead of the
terminal. Without a launcher to report to, every traceback is printed as usual.

A process of a multi-process job that raised then leaves at once with exit code 1 (after printing the
traceback and flushing its output), skipping the interpreter's teardown: tearing down a gloo process group
while another rank still talks to it is what aborted such jobs at exit ("terminate called ...", SIGABRT)
and made the exit code depend on timing. A single process exits as usual.
"""

from __future__ import annotations

import os
import sys
import traceback as tracebacks
from types import TracebackType
from typing import Any

from drivetrain import launch_channel

#: The traceback kept for the report is cut to its last characters beyond this.
MAX_TRACEBACK_CHARS = 64 * 1024

#: The hook that reports (the last installed; see install).
_active_hook: Any = None


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if len(text) > 500:
        text = text[:497] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def report_failure(rank: int, error: BaseException, traceback_text: str = "") -> dict[str, Any] | None:
    """Tell the launcher this process failed; its answer (``{"first": bool}``), or None without one."""
    return launch_channel.send(
        {
            "kind": "failure",
            "rank": rank,
            "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            "error": one_line(error),
            "traceback": traceback_text[-MAX_TRACEBACK_CHARS:],
        }
    )


def install(rank: int, num_processes: int) -> None:
    """Report an uncaught exception of this process (see the module docstring). Called when drivetrain is
    imported in a launched process, and again once the process state has joined the process group: torch
    then wraps ``sys.excepthook`` in one that prints into a buffer, which a hook of ours inside it would
    leave unprinted when it ends the process. So the hook installed last, the outermost, is the one that
    reports and ends the process; an earlier one only passes the error on."""
    global _active_hook
    if not os.environ.get(launch_channel.CHANNEL_ENV) or (
        _active_hook is not None and sys.excepthook is _active_hook
    ):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        if hook is not _active_hook:  # a later hook of ours, outside this one, reports and ends the process
            previous(kind, error, traceback)
            return
        answer = None
        try:
            answer = report_failure(rank, error, "".join(tracebacks.format_exception(kind, error, traceback)))
        except Exception:
            pass  # reporting must never hide the error itself
        if _print_traceback(answer, error, num_processes):
            previous(kind, error, traceback)
        if num_processes > 1 and not isinstance(error, KeyboardInterrupt):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    _active_hook = hook
    sys.excepthook = hook


def install_from_environment() -> None:
    """Install the hook when drivetrain is imported in a process of ``drivetrain launch`` (its rank and the
    job's size are torchrun's ``RANK`` and ``WORLD_SIZE``), so that an error before the script builds its
    Accelerator (reading its arguments or data, on every rank) is reported, and printed once, too."""
    try:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return  # the process state reports its own problem with these; it installs the hook then
    install(rank, world_size)


def _print_traceback(answer: dict[str, Any] | None, error: BaseException, num_processes: int) -> bool:
    """Whether this process prints its traceback: unless the launcher keeps it because another process
    failed first, or because the job is being stopped (SIGINT forwarded to every process)."""
    if answer is None:
        return True
    if isinstance(error, KeyboardInterrupt) and num_processes > 1:
        return False
    return bool(answer.get("first", True))
