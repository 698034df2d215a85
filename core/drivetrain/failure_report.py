"""Which process of a launched job failed first, and with what error.

torch's launcher orders failures by a timestamp in whole seconds, taken when it noticed them: when one rank
raises and the others then fail waiting for it (or are stopped), it often names the wrong rank, and says
nothing of the error. ``drivetrain launch`` gives every process a folder (``DRIVETRAIN_FAILURE_DIR``); a
process whose script ends with an uncaught exception writes one record there (its rank, the exact time and
the error in one line) before anything else happens, and the launcher reports the earliest record.

A process of a multi-process job that raised then leaves at once with exit code 1 (after printing the
traceback and flushing its output), skipping the interpreter's teardown: tearing down a gloo process group
while another rank still talks to it is what aborted such jobs at exit ("terminate called ...", SIGABRT)
and made the exit code depend on timing. A single process exits as usual.
"""

from __future__ import annotations

import json
import os
import sys
import time
from types import TracebackType
from typing import Any

FAILURE_DIR_ENV = "DRIVETRAIN_FAILURE_DIR"

_installed = False


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if len(text) > 500:
        text = text[:497] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def record_failure(rank: int, error: BaseException) -> None:
    """Write this process's failure record (first one only) into the launcher's folder, if there is one."""
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder:
        return
    path = os.path.join(folder, f"rank_{rank}.json")
    if os.path.exists(path):
        return
    record = {"rank": rank, "time": time.time(), "error": _one_line(error)}
    temporary = f"{path}.{os.getpid()}.partial"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(record, out)
    os.replace(temporary, path)


def install(rank: int, num_processes: int) -> None:
    """Record an uncaught exception of this process (see the module docstring); called once the process
    knows its rank."""
    global _installed
    if _installed or not os.environ.get(FAILURE_DIR_ENV):
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        try:
            record_failure(rank, error)
        except OSError:
            pass  # reporting must never hide the error itself
        previous(kind, error, traceback)
        if num_processes > 1 and not isinstance(error, KeyboardInterrupt):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    sys.excepthook = hook


def first_failure(folder: str) -> dict[str, Any] | None:
    """The earliest failure record in ``folder`` ({"rank", "time", "error"}), or None."""
    records = []
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                record = json.load(handle)
            records.append((float(record["time"]), int(record["rank"]), str(record["error"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not records:
        return None
    moment, rank, error = min(records)
    return {"rank": rank, "time": moment, "error": error}
