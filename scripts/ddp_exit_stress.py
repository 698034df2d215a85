"""Run a finished 2-process DDP training N times in a row and check that every run exits 0.

gloo can abort a rank at exit ("terminate called without an active exception") when the process group
outlives the DDP wrapper's reducer; the ddp plugin releases wrappers and meets the other ranks before
destroying the group. This script is the evidence: ``python scripts/ddp_exit_stress.py --runs 20``.
Exit status 0 when every run exited 0 with no abort message, 1 otherwise.

``--failing_rank R`` runs a job in which rank R raises instead (through ``drivetrain launch``): every run
must end with exit code 1, no abort, one traceback (rank R's) and the launcher's last line naming rank R
and its error:
``python scripts/ddp_exit_stress.py --runs 20 --failing_rank 1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from drivetrain.testing import launch_script

SCRIPTS = Path(__file__).resolve().parents[1] / "plugins" / "ddp" / "tests" / "scripts"
TRAINING_SCRIPT = SCRIPTS / "ddp_train_exit.py"
FAILING_SCRIPT = SCRIPTS / "ddp_rank_raises.py"
ABORT_MARKERS = ("terminate called", "Aborted", "core dumped", "SIGABRT")


def run_many(runs: int, num_processes: int = 2, script: Path = TRAINING_SCRIPT) -> list[tuple[int, str]]:
    """(exit code, problem) for each run; problem is "" for a clean exit."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="ddp-exit-stress-") as tmp:
        for _ in range(runs):
            result = launch_script(str(script), num_processes=num_processes, env={"TMPDIR": tmp}, check=False)
            output = result.stdout + result.stderr
            marker = next((m for m in ABORT_MARKERS if m in output), "")
            problem = (
                f"abort message {marker!r}" if marker else ("" if result.returncode == 0 else output[-2000:])
            )
            outcomes.append((result.returncode, problem))
    return outcomes


def run_failing(runs: int, failing_rank: int, num_processes: int = 2) -> list[tuple[int, str]]:
    """(exit code, problem) for each run of a job whose rank ``failing_rank`` raises; problem is "" when
    the run ended as it must (exit code 1, no abort, only that rank's traceback, the launcher naming that
    rank and its error)."""
    import subprocess

    expected = f"process of global rank {failing_rank} failed first (exit code 1): ValueError: boom on rank"
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="ddp-failure-stress-") as tmp:
        for _ in range(runs):
            command = [
                sys.executable,
                "-m",
                "drivetrain.launch",
                "--cpu",
                "--num_processes",
                str(num_processes),
            ]
            result = subprocess.run(
                [*command, str(FAILING_SCRIPT), str(failing_rank)],
                capture_output=True,
                text=True,
                env={**os.environ, "TMPDIR": tmp, "OMP_NUM_THREADS": "1"},
                timeout=300,
            )
            output = result.stdout + result.stderr
            last = (result.stderr.strip().splitlines() or [""])[-1]
            marker = next((m for m in ABORT_MARKERS if m in output), "")
            tracebacks = output.count("Traceback (most recent call last)")
            if marker:
                problem = f"abort message {marker!r}"
            elif result.returncode != 1 or expected not in last:
                problem = f"exit code {result.returncode}, last line {last!r}"
            elif tracebacks != 1:  # the other rank's error ("Connection closed by peer") is not printed
                problem = f"{tracebacks} tracebacks printed, not only the failing rank's"
            else:
                problem = ""
            outcomes.append((result.returncode, problem))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--failing_rank", type=int, default=None, help="this rank raises; see the docstring")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    if args.failing_rank is None:
        outcomes = run_many(args.runs, args.num_processes)
        failures = [(i, code, problem) for i, (code, problem) in enumerate(outcomes) if code != 0 or problem]
    else:
        outcomes = run_failing(args.runs, args.failing_rank, args.num_processes)
        failures = [(i, code, problem) for i, (code, problem) in enumerate(outcomes) if problem]
    print(
        f"{args.runs} runs of {args.num_processes} processes in {time.perf_counter() - start:.0f} s: "
        f"exit codes {[code for code, _ in outcomes]}"
    )
    for index, code, problem in failures:
        print(f"run {index} failed (exit code {code}): {problem}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
