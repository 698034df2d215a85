"""Launch overhead: time from `drivetrain launch --num_processes 2 noop.py` to both processes running,
against `torchrun` on the same script (both go through torch's elastic launcher).

    python bench/launch_overhead.py [--repeats 5] [--banner] [--inherit-env]

Each process writes the wall-clock time at which it started running the script; the figure is the time from
starting the launcher command to the later of the two. Reports the median of the repeats, and the median CPU
time of the whole launch (launcher and both processes, start to exit), which other load on a shared machine
disturbs less than wall-clock time. Last, the CPU time each launcher spends on its own work between importing
torch's elastic launcher and calling it (measured in a separate run with that call replaced): the difference
between the two launchers, without the noise of torch's import and of the processes.

drivetrain launch runs with --quiet unless --banner is given (the banner names the automatic backend, which
imports plugin modules to find it). Both launchers run as an installed package does, from compiled bytecode:
PYTHONDONTWRITEBYTECODE is dropped from their environment and one untimed run of each writes the caches
next to the sources (pip compiles at install time, so torch's are there already; an editable checkout has
none until something writes them). --inherit-env keeps the environment as it is: under
PYTHONDONTWRITEBYTECODE=1, modules that have no cache yet are compiled again on every run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOOP = """import os, sys, time
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(time.time()))
"""


def measure(command: list[str], folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """(seconds until both processes run, CPU seconds of the whole launch: launcher and processes)."""
    for old in folder.glob("[0-9]"):
        old.unlink()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return max(float((folder / rank).read_text()) for rank in ("0", "1")) - start, cpu


#: Runs one launcher with torch's elastic ``run`` replaced: reports the CPU time the launcher spent between
#: importing torch's launcher and calling it, i.e. its own work (torch's import is the same for both).
STARTUP_PROBE = """import os, sys, time
import torch.distributed.run as torchrun

start = time.process_time()


def report(args):
    os.write(int(os.environ["LAUNCH_BENCH_FD"]), repr(time.process_time() - start).encode())


torchrun.run = report
if sys.argv[1] == "torchrun":
    torchrun.main(sys.argv[2:])
else:
    from drivetrain.commands.launch import main

    main(sys.argv[2:])
"""


def startup_cpu(arguments: list[str], env: dict[str, str]) -> float:
    """CPU seconds of the launcher's own work before it calls torch's elastic launcher (see STARTUP_PROBE)."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", STARTUP_PROBE, *arguments],
            env={**env, "LAUNCH_BENCH_FD": str(write_end)},
            pass_fds=(write_end,),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(write_end)
        reported = os.read(read_end, 100)
    finally:
        os.close(read_end)
    if process.wait() != 0 or not reported:
        raise RuntimeError(f"the startup probe failed for {arguments}")
    return float(reported)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--banner", action="store_true", help="time drivetrain launch without --quiet")
    parser.add_argument(
        "--inherit-env", action="store_true", help="keep PYTHONDONTWRITEBYTECODE as inherited, no warm-up run"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        script = folder / "noop.py"
        script.write_text(NOOP)
        commands = {
            "torchrun": [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                str(script),
                tmp,
            ],
            "drivetrain launch": [
                sys.executable,
                "-m",
                "drivetrain.launch",
                "--cpu",
                "--num_processes",
                "2",
                *([] if args.banner else ["--quiet"]),
                str(script),
                tmp,
            ],
        }
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": tmp}
        if not args.inherit_env:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            for command in commands.values():  # writes the bytecode caches; not timed
                measure(command, folder, env)
        results: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        own: dict[str, list[float]] = {name: [] for name in commands}
        probes = {
            name: ["torchrun" if name == "torchrun" else "drivetrain", *command[3:]]
            for name, command in commands.items()
        }
        for _ in range(args.repeats):  # interleaved, so background load affects both alike
            for name, command in commands.items():
                wall, cpu_seconds = measure(command, folder, env)
                results[name].append(wall)
                cpu[name].append(cpu_seconds)
                own[name].append(startup_cpu(probes[name], env))
    medians = {name: statistics.median(times) for name, times in results.items()}
    cpu_medians = {name: statistics.median(times) for name, times in cpu.items()}
    for name, value in medians.items():
        print(
            f"{name:18s} median {value:.3f} s  (runs: {', '.join(f'{t:.2f}' for t in results[name])}); "
            f"CPU time of the whole launch, median {cpu_medians[name]:.3f} s; the launcher's own work before "
            f"torch's elastic launcher, median {statistics.median(own[name]) * 1000:.0f} ms CPU"
        )
    conditions = [
        "banner" if args.banner else "--quiet",
        "inherited environment" if args.inherit_env else "bytecode cached",
    ]
    print(f"conditions: {', '.join(conditions)}")
    print(
        f"ratio drivetrain/torchrun: {medians['drivetrain launch'] / medians['torchrun']:.3f} (target <= 1.10); "
        f"CPU time ratio {cpu_medians['drivetrain launch'] / cpu_medians['torchrun']:.3f} (less sensitive to "
        "other load on the machine)"
    )


if __name__ == "__main__":
    main()
