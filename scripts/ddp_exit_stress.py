"""Run a finished 2-process DDP training N times in a row and check that every run exits 0.

gloo can abort a rank at exit ("terminate called without an active exception") when the process group
outlives the DDP wrapper's reducer; the ddp plugin releases wrappers and meets the other ranks before
destroying the group. This script is the evidence: ``python scripts/ddp_exit_stress.py --runs 20``.
Exit status 0 when every run exited 0 with no abort message, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from drivetrain.testing import launch_script

TRAINING_SCRIPT = (
    Path(__file__).resolve().parents[1] / "plugins" / "ddp" / "tests" / "scripts" / "ddp_train_exit.py"
)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--num_processes", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    outcomes = run_many(args.runs, args.num_processes)
    failures = [(i, code, problem) for i, (code, problem) in enumerate(outcomes) if code != 0 or problem]
    print(
        f"{args.runs} runs of {args.num_processes} processes in {time.perf_counter() - start:.0f} s: "
        f"exit codes {[code for code, _ in outcomes]}"
    )
    for index, code, problem in failures:
        print(f"run {index} failed (exit code {code}): {problem}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
