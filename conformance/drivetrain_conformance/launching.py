"""Starting the worker processes and watching them: records as they come, and a hang named when one happens.

Each rank appends JSON lines to ``rank<R>.jsonl`` (see worker.py): a ``started`` record before every step and
its result after. :func:`launch` reads them while the processes run, hands every record to a callback (so
verdicts print as properties finish) and, when one step runs longer than the per-step limit, asks every
rank for a stack dump (SIGUSR1, faulthandler), stops the launch and returns a :class:`Hang` saying which step
hung, in which hook, and in which collective each rank waits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import attrs

from drivetrain_conformance import worker
from drivetrain_conformance.worker import ORACLE_STEP, RESUME_STEP, SETUP_STEP

#: What a rank does before its first record: starting Python, importing torch.
START_STEP = "(start-up)"
#: Steps that may legitimately take much longer than a property (importing torch on a loaded machine, a
#: backend compiling its extensions in setup_process_group, the oracle training every reference run): they get
#: SETUP_FACTOR times the per-property limit.
SETUP_FACTOR = 5
_SLOW_STEPS = (START_STEP, SETUP_STEP, ORACLE_STEP, RESUME_STEP)
#: How long a rank's threads get to write their stacks after SIGUSR1 before the launch is stopped.
DUMP_GRACE_S = 1.5
_POLL_S = 0.2


@attrs.define
class Hang:
    """A step that ran longer than the limit: where every rank was when the launch was stopped."""

    target: str
    step: str
    limit: float
    #: rank -> one line: the hook, the collective and the suite's line it waits in
    where: dict[int, str]
    #: rank -> the stack of its main thread (most recent call first)
    stacks: dict[int, str]

    def describe(self) -> str:
        ranks = "; ".join(f"rank {rank}: {line}" for rank, line in sorted(self.where.items()))
        which = (
            f"{SETUP_FACTOR} times the per-property limit, for set-up"
            if self.step in _SLOW_STEPS
            else "the per-property limit"
        )
        return f"timed out after {self.limit:g} s ({which}, --timeout): {ranks}"


@attrs.define
class Launch:
    returncode: int | None
    output: str
    records: dict[int, list[dict]]
    tensors_dir: str
    hang: Hang | None = None


def limit_of(step: str, limit: float) -> float:
    """Seconds ``step`` may run: the per-property ``limit``, or SETUP_FACTOR times it for set-up steps."""
    return limit * SETUP_FACTOR if step in _SLOW_STEPS else limit


def _command(args: list[str], processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable, worker.__file__, *args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "--monitor_interval=0.1",
        worker.__file__,
        *args,
    ]


class _Records:
    """The ranks' record files, read as they grow (a line is taken once it ends with a newline)."""

    def __init__(self, workdir: str, processes: int) -> None:
        self.paths = {rank: os.path.join(workdir, f"rank{rank}.jsonl") for rank in range(processes)}
        # Files of an earlier launch into the same folder: only what this launch appends is new.
        self.offsets = {
            rank: os.path.getsize(p) if os.path.exists(p) else 0 for rank, p in self.paths.items()
        }

    def new(self) -> list[tuple[int, dict]]:
        found = []
        for rank, path in self.paths.items():
            if not os.path.exists(path):
                continue
            with open(path) as stream:
                stream.seek(self.offsets[rank])
                text = stream.read()
            complete = text[: text.rfind("\n") + 1]
            self.offsets[rank] += len(complete.encode())
            found += [(rank, json.loads(line)) for line in complete.splitlines() if line]
        return found


def launch(
    args: list[str],
    processes: int,
    workdir: str,
    limit: float,
    number: int = 0,
    on_record: Callable[[int, dict], None] | None = None,
) -> Launch:
    """Run the worker with ``args`` on ``processes`` processes; stop it when one step runs over ``limit``
    seconds. ``on_record(rank, record)`` sees every record as it is written."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": workdir}
    log_path = os.path.join(workdir, f"launch-{number}.log")
    records: dict[int, list[dict]] = {rank: [] for rank in range(processes)}
    reader = _Records(workdir, processes)
    started_at = time.monotonic()
    #: rank -> (target, step, since): what each rank does now
    doing: dict[int, tuple[str, str, float]] = {
        rank: ("", START_STEP, started_at) for rank in range(processes)
    }
    pids: dict[int, int] = {}
    #: (target, step) -> seconds allowed beyond its limit (granted while it builds a C++ extension)
    extra: dict[tuple[str, str], float] = {}
    hang = None
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [*_command(args, processes), "--launch", str(number)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the launch and its workers can be stopped as one group
        )
        try:
            while True:
                finished = process.poll() is not None
                now = time.monotonic()
                for rank, record in reader.new():
                    records[rank].append(record)
                    if "pid" in record:
                        pids[rank] = record["pid"]
                    elif record.get("started"):
                        doing[rank] = (record["target"], record["property"], now)
                    elif "property" in record:
                        doing[rank] = (record["target"], f"after {record['property']}", now)
                    elif record.get("finished"):
                        doing.pop(rank, None)
                    if on_record is not None and not record.get("started"):
                        on_record(rank, record)
                if finished:
                    break
                over = [
                    entry
                    for entry in doing.values()
                    if now - entry[2] > limit_of(entry[1], limit) + extra.get(entry[:2], 0.0)
                ]
                if over:
                    target, step, since = min(over, key=lambda entry: entry[2])
                    frames = _dump(pids, workdir, number)
                    allowed = limit_of(step, limit) + extra.get((target, step), 0.0)
                    if any(map(_building, frames.values())) and allowed < limit * SETUP_FACTOR:
                        # Compiling a C++ extension is progress, not a hang: give it more time, up to the
                        # set-up steps' allowance.
                        extra[(target, step)] = extra.get((target, step), 0.0) + limit
                        continue
                    _stop(process, pids)
                    hang = _hang((target, step), allowed, frames, processes)
                    break
                time.sleep(_POLL_S)
        except BaseException:  # an interrupted run leaves no process behind
            for pid in [*pids.values(), process.pid]:
                _kill_group(pid)
            process.wait()
            raise
        returncode = None if hang is not None else process.returncode
    with open(log_path, errors="replace") as log:
        output = log.read()
    return Launch(returncode, output, records, workdir, hang)


def _dump(pids: dict[int, int], workdir: str, number: int) -> dict[int, list[tuple[str, int, str]]]:
    """Every started rank's main-thread stack now: SIGUSR1 makes faulthandler append the stacks of its
    threads to the rank's stack file; only what this dump appended is read."""
    paths = {rank: os.path.join(workdir, f"stacks.{number}.rank{rank}.txt") for rank in pids}
    sizes = {rank: os.path.getsize(path) if os.path.exists(path) else 0 for rank, path in paths.items()}
    for pid in pids.values():
        _signal(pid, signal.SIGUSR1)
    time.sleep(DUMP_GRACE_S)
    frames = {}
    for rank, path in paths.items():
        with open(path, "rb") as stream:
            stream.seek(sizes[rank])
            frames[rank] = main_thread_frames(stream.read().decode(errors="replace"))
    return frames


def _building(frames: list[tuple[str, int, str]]) -> bool:
    """Whether a stack is inside torch's C++ extension building (or waiting for another process's build)."""
    return any(file.endswith(("cpp_extension.py", "file_baton.py")) for file, _, _ in frames)


def _stop(process: subprocess.Popen, pids: dict[int, int]) -> None:
    """Stop the launch and every worker, each with what it started (a compiler building an extension,
    say): torch's launcher starts each worker in a session of its own."""
    for pid in [*pids.values(), process.pid]:
        _kill_group(pid)
    process.wait()


def _hang(
    hung: tuple[str, str], limit: float, frames: dict[int, list[tuple[str, int, str]]], processes: int
) -> Hang:
    where, stacks = {}, {}
    for rank in range(processes):
        found = frames.get(rank)
        if found is None:
            where[rank] = "had not started (no record yet)"
            continue
        stacks[rank] = "\n".join(
            f'  File "{file}", line {line} in {function}' for file, line, function in found
        )
        where[rank] = where_it_waits(found) if found else "no stack dump (the process did not answer SIGUSR1)"
    return Hang(*hung, limit, where, stacks)


def _kill_group(pid: int) -> None:
    """Kill the process group ``pid`` leads (a worker started in a session of its own, or the launch), or
    only ``pid`` when it leads none."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError:  # gone already
        pass


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:  # exited meanwhile
        pass


_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+)$')


def main_thread_frames(dump: str) -> list[tuple[str, int, str]]:
    """The frames (file, line, function; most recent call first) of the thread that runs the worker script,
    from a faulthandler dump of every thread."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
            continue
        match = _FRAME.match(line)
        if match and threads:
            threads[-1].append((match["file"], int(match["line"]), match["function"]))
    for frames in threads:
        if frames and os.path.basename(frames[-1][0]) == "worker.py":
            return frames
    return threads[0] if threads else []


def _package_folder(name: str) -> str:
    import importlib

    return os.path.dirname(importlib.import_module(name).__file__ or "") + os.sep


def where_it_waits(frames: list[tuple[str, int, str]]) -> str:
    """One line for a stuck rank: the hook it is in, the torch.distributed call it waits in (the last
    collective it entered), and the suite's line that led there."""
    from drivetrain.plugin_api.tooling import HOOK_SPECS

    kernel, suite = _package_folder("drivetrain"), _package_folder("drivetrain_conformance")
    torch_folder = _package_folder("torch")
    distributed = os.path.join(torch_folder, "distributed") + os.sep

    def short(frame: tuple[str, int, str]) -> str:
        return f"{os.path.basename(frame[0])}:{frame[1]} in {frame[2]}"

    import sysconfig

    outside = (kernel, suite, torch_folder, sysconfig.get_paths()["stdlib"])
    collective = next((f for f in frames if f[0].startswith(distributed)), None)
    hook = next((f for f in frames if f[2] in HOOK_SPECS and not f[0].startswith(outside)), None)
    backend = next((f for f in frames if not f[0].startswith(outside) and "pluggy" not in f[0]), None)
    check = next((f for f in frames if f[0].startswith(suite) and not f[0].endswith("worker.py")), None)
    parts = []
    if hook is not None:
        parts.append(f"in hook {hook[2]} ({short(hook)})")
    elif check is not None and frames.index(check) > 0:
        entered = frames[frames.index(check) - 1]  # what the suite called: Accelerator.reduce, say
        parts.append(f"in {entered[2]} ({short(entered)}), no hook on the stack")
    if backend is not None and backend is not hook:
        parts.append(f"in the backend's {backend[2]} ({short(backend)})")
    if collective is not None:
        parts.append(f"waiting in torch.distributed's {collective[2]} ({short(collective)})")
    else:
        parts.append(f"not in a torch.distributed call (innermost: {short(frames[0])})")
    if frames[0][0].endswith(os.path.join("utils", "file_baton.py")):
        parts.append(
            "waiting for another process to build a C++ extension (torch's lock file in TORCH_EXTENSIONS_DIR; "
            "one left by a stopped build blocks for ever: delete it)"
        )
    if check is not None:
        parts.append(f"called from {short(check)}")
    return ", ".join(parts)
