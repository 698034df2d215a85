"""SIGKILL ``drivetrain launch`` while its two processes train, N times, and count what is left.

Each run starts a 2-process CPU job (tests/scripts/launch_supervised.py, which writes a file per step),
waits until both processes train, kills the launcher with SIGKILL and checks, within 30 s, that no
process of the job is left (the ranks and anything in their process groups) and that the temporary
folder the run was given (``TMPDIR``) is still empty. Linux only (``/proc``, ``PR_SET_PDEATHSIG``).

    python scripts/launcher_kill_stress.py --runs 40

Exit status 0 when every run left nothing, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "launch_supervised.py"


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (R, S, Z, ...), or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")  # a zombie has ended; only its parent's wait is due


def group_members(groups: set[int]) -> list[int]:
    """Live processes whose process group is one of ``groups`` (a rank and what it started)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) in groups and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def start_job(
    workdir: Path, mode: str = "train", extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, Path]:
    """Start the 2-process job in ``workdir`` with ``workdir/tmp`` as its TMPDIR; (launcher, pid folder)."""
    tmp, pids = workdir / "tmp", workdir / "pids"
    tmp.mkdir(parents=True, exist_ok=True)
    pids.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "TMPDIR": str(tmp),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "DRIVETRAIN_CONFIG_DIR": str(workdir / "no-config"),
        # torch keeps a compile cache per user in the temporary folder once a script builds an optimizer
        # (torchinductor_<user>), launched or not: not the launcher's, and kept out of the folder checked
        "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor-cache"),
    }
    command = [sys.executable, "-m", "drivetrain.launch", "--cpu", "--num_processes", "2", *extra]
    with open(workdir / "launcher.out", "w") as out, open(workdir / "launcher.err", "w") as err:
        launcher = subprocess.Popen(
            [*command, str(SCRIPT), str(pids), mode], env=env, cwd=workdir, stdout=out, stderr=err
        )
    return launcher, pids


def wait_for(condition, seconds: float, what: str, launcher: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if launcher is not None and launcher.poll() is not None:
            raise RuntimeError(f"the launcher ended (exit code {launcher.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def rank_pids(pids: Path) -> list[int]:
    return [int((pids / f"rank_{rank}.pid").read_text()) for rank in (0, 1)]


def kill_once(workdir: Path, mode: str = "train", start_timeout: float = 240) -> dict:
    """One run (``mode``: what the ranks do, see launch_supervised.py); returns {"survivors": live processes
    of the job 30 s after the kill, "leftover": names in its TMPDIR, "ended_after": seconds until the ranks
    were gone}."""
    launcher, pids = start_job(workdir, mode)
    try:
        wait_for(
            lambda: all(
                (pids / name).exists()
                for name in ("rank_0.pid", "rank_1.pid", "step_rank0.txt", "step_rank1.txt")
            ),
            start_timeout,
            "both processes to train",
            launcher,
        )
    except RuntimeError:
        launcher.kill()
        launcher.wait()
        raise RuntimeError((workdir / "launcher.err").read_text()[-3000:]) from None
    ranks = rank_pids(pids)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    killed = time.monotonic()
    deadline = killed + 30
    while time.monotonic() < deadline and (any(map(alive, ranks)) or group_members(set(ranks))):
        time.sleep(0.05)
    ended_after = time.monotonic() - killed
    survivors = sorted({pid for pid in ranks if alive(pid)} | set(group_members(set(ranks))))
    for pid in survivors:  # leave the machine clean for the next run whatever happened
        os.kill(pid, signal.SIGKILL)
    return {
        "survivors": survivors,
        "leftover": sorted(os.listdir(workdir / "tmp")),
        "ended_after": round(ended_after, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args(argv)
    outcomes = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="launcher-kill-stress-") as folder:
        for run in range(args.runs):
            outcome = kill_once(Path(folder) / f"run_{run}")
            outcomes.append(outcome)
            print(f"run {run}: {outcome}", flush=True)
    left = sum(len(outcome["survivors"]) for outcome in outcomes)
    files = sum(len(outcome["leftover"]) for outcome in outcomes)
    slowest = max(outcome["ended_after"] for outcome in outcomes)
    print(
        f"{args.runs} runs in {time.perf_counter() - start:.0f} s: {left} processes left, {files} files left in "
        f"TMPDIR; the ranks were gone at most {slowest} s after the kill"
    )
    return 1 if left or files else 0


if __name__ == "__main__":
    sys.exit(main())
