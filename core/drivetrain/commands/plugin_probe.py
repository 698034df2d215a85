"""What ``drivetrain plugins`` shows of each plugin (:func:`plugin_record`), built where no plugin can take the
listing down.

The kernel imports a plugin module on a helper thread with a time limit (contract/registry.py), which stops
a plugin that raises, exits or sleeps. It cannot stop one that hangs in C code holding the GIL (the waiting
thread never runs again) or one that ends the process (``os._exit``, a signal to itself, a crash). So the
listing imports the plugins in a child process and watches it: each plugin is announced before its import
and its record sent after, as JSON lines on a pipe. A child that stops answering within the time limit
(``DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT``) is killed, a child that ends early is noted, and the plugin it was
importing is listed as broken with what happened; a new child then lists the plugins after it. The
listing process itself imports no plugin.

Run as ``python -m drivetrain.commands.plugin_probe FD PARENT_PID [--all] [NAME...]`` by
:func:`probe_records`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Any

#: Seconds the listing waits past the import time limit for the child's own report of a hang (it reports
#: a plugin that hangs in Python itself, and goes on with the next plugin without a restart).
GRACE = 2.0
TIMEOUT_ENV = "DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT"


def probe_records(names: list[str], detailed: bool) -> dict[str, dict[str, Any]]:
    """Records (as :func:`plugin_record` builds them) of the entry-point plugins
    ``names``, each imported in a child process. A plugin that hangs or ends that process is recorded as
    broken."""
    from drivetrain.contract.registry import import_time_limit
    from drivetrain.errors import PluginError

    limit = import_time_limit()
    records: dict[str, dict[str, Any]] = {}
    while True:
        remaining = [name for name in names if name not in records]
        if not remaining:
            return records
        found, culprit, problem = _run_child(remaining, detailed, limit)
        records.update(found)
        if culprit is not None:
            records[culprit] = broken_record(culprit, problem)
        elif not found:
            raise PluginError(
                f"could not list the plugins: the listing process failed before any import ({problem})"
            )


def plugin_record(manager: Any, name: str, detailed: bool) -> dict[str, Any]:
    """What the listing shows of plugin ``name`` (importing it in this process)."""
    from drivetrain.contract.registry import check_requirements, missing_library
    from drivetrain.errors import PluginError

    record = manager.discovered()[name]
    entry: dict[str, Any] = {
        "name": name,
        "distribution": record.distribution,
        "version": record.version,
        "module": record.value,
    }
    try:
        manager.load(name)
    except PluginError as exc:
        entry.update(kind=None, hooks=[], available=False, broken=True, problem=str(exc))
        return entry
    info = manager.info(name)
    problem = check_requirements(info)
    entry.update(
        kind=info.kind,
        hooks=manager.hooks_of(name),
        requires=list(info.requires),
        optional_requires={
            library: {"enables": enables, "problem": missing_library(library)}
            for library, enables in info.optional_requires.items()
        },
        available=problem is None,
        broken=False,
        problem=problem,
    )
    if detailed:
        extensions = manager.extensions
        entry.update(
            description=info.description,
            contract=info.contract,
            # every declared field (docs/plugins/capabilities.md), tuples as JSON lists
            capabilities={
                field.name: _plain(getattr(info.capabilities, field.name))
                for field in dataclasses.fields(info.capabilities)
            },
            commands=sorted(k for k, v in extensions.commands.items() if v[0] == name),
            trackers=sorted(k for k, v in extensions.trackers.items() if v[0] == name),
            launchers=sorted(k for k, v in extensions.launchers.items() if v[0] == name),
            launch_options=any(owner == name for owner, _ in extensions.launch_options),
        )
    return entry


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def broken_record(name: str, problem: str) -> dict[str, Any]:
    """The listing's record of a plugin whose import took its process down."""
    from drivetrain.contract.registry import PluginImportTimeout, get_plugin_registry, import_failure

    record = get_plugin_registry().discovered()[name]
    return {
        "name": name,
        "distribution": record.distribution,
        "version": record.version,
        "module": record.value,
        "kind": None,
        "hooks": [],
        "available": False,
        "broken": True,
        "problem": import_failure(record, PluginImportTimeout(problem)),
    }


def _run_child(
    names: list[str], detailed: bool, limit: float
) -> tuple[dict[str, dict[str, Any]], str | None, str]:
    """Run one child over ``names``: (records it sent, the plugin it was importing when it hung or ended
    before finishing, or None, and what happened). ``limit``: seconds one import may take (0: no limit)."""
    read_end, write_end = os.pipe()
    command = [
        sys.executable,
        "-m",
        __name__,
        str(write_end),
        str(os.getpid()),
        *(["--all"] if detailed else []),
        *names,
    ]
    try:
        child = subprocess.Popen(
            command,
            pass_fds=(write_end,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # what a plugin prints while importing is not the listing's output
            start_new_session=True,  # its own process group: a hung child is stopped with what it started
        )
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb", buffering=0) as pipe, selectors.DefaultSelector() as selector:
        selector.register(pipe, selectors.EVENT_READ)
        try:
            return _follow(child, pipe, selector, limit)
        finally:
            if child.poll() is None:  # interrupted (Ctrl-C): a hung child must not outlive the listing
                _stop(child)


def _follow(
    child: subprocess.Popen, pipe: Any, selector: selectors.BaseSelector, limit: float
) -> tuple[dict[str, dict[str, Any]], str | None, str]:
    """Read the child's messages until it ends or its current import runs past the limit."""
    found: dict[str, dict[str, Any]] = {}
    current: str | None = None
    started = 0.0
    buffer = b""
    while True:
        # the clock runs only during a plugin's import: the child's own start (torch) is not a plugin's
        wait = None if limit <= 0 or current is None else limit + GRACE - (time.monotonic() - started)
        if wait is not None and wait <= 0:
            _stop(child)
            return found, current, f"it did not finish importing within {limit:g} s ({TIMEOUT_ENV})"
        if not selector.select(wait):
            continue
        chunk = pipe.read(65536)
        if not chunk:  # the child ended
            code = child.wait()
            if current is None and code == 0:
                return found, None, ""
            return found, current, _how_it_ended(code)
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        try:
            for line in lines:
                message = json.loads(line)
                if "start" in message:
                    current, started = str(message["start"]), time.monotonic()
                else:
                    found[message["record"]["name"]] = message["record"]
                    current = None
        except (ValueError, KeyError, TypeError):  # something else wrote on the pipe
            _stop(child)
            return found, current, "the process wrote something else than the listing while importing it"


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the process was killed by {name} while importing it"
    return f"it ended the process (exit code {code}) while importing"


def _stop(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        child.kill()
    child.wait()


def main(argv: list[str]) -> int:
    """The child: import each named plugin and send its record (see the module docstring)."""
    import torch  # noqa: F401  the kernel's own dependency: its import time is not a plugin's

    from drivetrain import rank_guard
    from drivetrain.contract.registry import get_plugin_registry

    out = os.fdopen(int(argv[0]), "w", buffering=1, encoding="utf-8")
    if not rank_guard.die_with_parent(int(argv[1])):  # a listing killed outright takes this child with it
        return 1
    detailed = "--all" in argv[2:]
    manager = get_plugin_registry()
    for name in [arg for arg in argv[2:] if arg != "--all"]:
        out.write(json.dumps({"start": name}) + "\n")
        out.write(json.dumps({"record": plugin_record(manager, name, detailed)}, default=str) + "\n")
    out.close()
    return 0


if __name__ == "__main__":
    # A plugin's thread still stuck in its import (or any it started) must not delay the exit: all is sent.
    os._exit(main(sys.argv[1:]))
