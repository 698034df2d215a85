"""The processes of a launch end with their launcher, leave nothing in the temporary folder, and a failure
prints one traceback and one line (issue 29, findings 6 and 9). Real launches, real signals.

The 40-run version of the SIGKILL test: ``python scripts/launcher_kill_stress.py --runs 40``.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's"),
]


def _stress_module():
    spec = importlib.util.spec_from_file_location(
        "launcher_kill_stress", ROOT / "scripts" / "launcher_kill_stress.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stress = _stress_module()


def test_sigkill_to_the_launcher_ends_every_process_and_leaves_no_file(tmp_path):
    """Ranks that nothing but the launcher could end (no collective to fail when the other goes): the
    training version is the 40-run stress script's."""
    outcome = stress.kill_once(tmp_path, mode="idle")
    assert outcome["survivors"] == [], outcome
    assert outcome["leftover"] == [], outcome
    # the ranks were working: they stopped once killed
    steps = (tmp_path / "pids" / "step_rank0.txt").read_text()
    time.sleep(0.5)
    assert (tmp_path / "pids" / "step_rank0.txt").read_text() == steps


def _finish(launcher: subprocess.Popen, workdir: Path, timeout: float = 240) -> tuple[int, str]:
    launcher.wait(timeout=timeout)
    return launcher.returncode, (workdir / "launcher.err").read_text()


#: The launcher checks on its processes every 5 s here, so that rank 1 always meets rank 0's failure in its
#: collective (and reports it) before the launcher stops it: the case the noise came from.
SLOW_MONITOR = ("--monitor_interval", "5")
FIRST = "drivetrain: error: process of global rank 0 failed first (exit code 1): ValueError: boom on rank 0"


def test_when_rank_0_raises_only_its_traceback_and_one_line_are_printed(tmp_path):
    launcher, _ = stress.start_job(tmp_path, mode="raise0", extra=SLOW_MONITOR)
    code, err = _finish(launcher, tmp_path)
    assert code == 1
    assert err.count("Traceback (most recent call last)") == 1 and "ValueError: boom on rank 0" in err, err
    assert "Connection closed by peer" not in err and "DistBackendError" not in err, err
    assert (
        err.strip().splitlines()[-1] == f"{FIRST}; rank 1 failed after it (--debug prints their tracebacks)"
    )
    assert os.listdir(tmp_path / "tmp") == []


def test_the_channel_answers_first_once_per_attempt_and_keeps_every_traceback(monkeypatch):
    """What the processes of a job send on the launch channel (real sockets, in this process): the first
    failure of an attempt is told to print, later ones are kept for the report that --debug prints."""
    from drivetrain.commands.launch_outcome import failure_report_text
    from drivetrain.failure_report import report_failure
    from drivetrain.launch_channel import LaunchChannel, send

    def error(text):
        try:
            raise RuntimeError(text)
        except RuntimeError as exc:
            return exc

    with LaunchChannel() as channel:
        for variable, value in channel.environment.items():
            monkeypatch.setenv(variable, value)
        assert report_failure(0, error("boom"), "Traceback 0\n") == {"first": True}
        assert report_failure(1, error("Connection closed by peer"), "Traceback 1\n") == {"first": False}
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restarted group has a first failure again
        assert report_failure(1, error("boom again"), "Traceback 1b\n") == {"first": True}
        assert send({"kind": "backend", "name": "ddp", "source": "automatic"}) == {}
        token = channel.environment["DRIVETRAIN_LAUNCH_CHANNEL"].rsplit(":", 1)[1]
        monkeypatch.setenv(
            "DRIVETRAIN_LAUNCH_CHANNEL",
            channel.environment["DRIVETRAIN_LAUNCH_CHANNEL"][: -len(token)] + "0" * 32,
        )
        assert report_failure(5, error("forged"), "") == {}  # a wrong token is ignored
        first = channel.first_failure()
        assert (first["rank"], first["attempt"], first["error"]) == (1, 1, "RuntimeError: boom again")
        assert channel.backend == ("ddp", "automatic")
        assert [record["rank"] for record in channel.failures] == [0, 1, 1]
        report = failure_report_text(channel, first)
    assert report == (
        "--- process of global rank 0: RuntimeError: boom\nTraceback 0\n"
        "--- process of global rank 1: RuntimeError: Connection closed by peer\nTraceback 1\n"
    )
    monkeypatch.delenv("DRIVETRAIN_LAUNCH_CHANNEL")
    assert send({"kind": "backend"}) is None  # no launcher: nothing to tell, nothing raised


def test_an_error_before_the_accelerator_is_reported_and_printed_once(tmp_path, monkeypatch):
    """From ``import drivetrain`` on, a launched process reports its uncaught error: here rank 1 of 2 fails
    reading its data after rank 0 already reported the same failure, so it prints nothing and exits with 1."""
    from drivetrain.failure_report import report_failure
    from drivetrain.launch_channel import LaunchChannel

    script = "import drivetrain\nopen('missing-dataset.csv')\n"
    with LaunchChannel() as channel:
        for variable, value in channel.environment.items():
            monkeypatch.setenv(variable, value)
        assert report_failure(0, FileNotFoundError("missing-dataset.csv"), "Traceback 0\n") == {"first": True}
        env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
        )
        assert done.returncode == 1 and done.stderr == "", done.stderr
        second = channel.failures[1]
        assert (second["rank"], second["error"]) == (
            1,
            "FileNotFoundError: [Errno 2] No such file or directory: 'missing-dataset.csv'",
        )
        assert second["traceback"].startswith("Traceback (most recent call last):")


def test_sigint_to_the_launcher_prints_no_rank_traceback(tmp_path):
    launcher, pids = stress.start_job(tmp_path, mode="idle")
    stress.wait_for(
        lambda: all((pids / f"step_rank{rank}.txt").exists() for rank in (0, 1)),
        240,
        "both processes",
        launcher,
    )
    ranks = stress.rank_pids(pids)
    launcher.send_signal(signal.SIGINT)
    code, err = _finish(launcher, tmp_path, timeout=120)
    assert code == 128 + signal.SIGINT
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert (
        err.strip().splitlines()[-1]
        == "drivetrain: error: stopped by SIGINT: the job's processes were stopped"
    )
    assert not any(map(stress.alive, ranks))
    assert os.listdir(tmp_path / "tmp") == []


def test_sigkill_to_a_notebook_launcher_ends_its_forked_processes(tmp_path):
    """notebook_launcher / debug_launcher fork the caller: killing the caller (a notebook kernel) ends them,
    and no torchelastic_* folder is made in the temporary folder."""
    (tmp_path / "tmp").mkdir()
    program = textwrap.dedent(
        f"""
        import os, time
        from drivetrain import debug_launcher

        def train():
            with open(os.path.join({str(tmp_path)!r}, f"child_{{os.environ['RANK']}}.pid"), "w") as out:
                out.write(str(os.getpid()))
            while True:
                time.sleep(0.05)

        debug_launcher(train, num_processes=2)
        """
    )
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen([sys.executable, "-c", program], env=env, cwd=tmp_path)
    stress.wait_for(
        lambda: all((tmp_path / f"child_{rank}.pid").exists() for rank in (0, 1)), 240, "the children", parent
    )
    time.sleep(0.2)  # the pid files are written whole before the children loop
    children = [int((tmp_path / f"child_{rank}.pid").read_text()) for rank in (0, 1)]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    stress.wait_for(lambda: not any(map(stress.alive, children)), 30, "the children to end")
    assert os.listdir(tmp_path / "tmp") == []


def test_the_rank_guard_runs_the_command_only_while_its_launcher_lives(tmp_path):
    """rank_guard.py as torch's launcher starts it: the command runs in its place (same process id) when
    the launcher is its parent; not at all when the launcher is gone (another parent); a missing program
    is one line and exit code 127, as a shell says."""
    guard = [sys.executable, "-I", "-S", str(ROOT / "core" / "drivetrain" / "rank_guard.py")]
    # the command reports its process id, its parent and its parent-death signal (prctl PR_GET_PDEATHSIG)
    show = [
        sys.executable,
        "-c",
        "import ctypes, os; signal = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(signal), 0, 0, 0); "
        "print(os.getpid(), os.getppid(), signal.value)",
    ]
    ran = subprocess.Popen([*guard, str(os.getpid()), "--", *show], stdout=subprocess.PIPE, text=True)
    out, _ = ran.communicate(timeout=120)
    assert ran.returncode == 0
    assert out.split() == [str(ran.pid), str(os.getpid()), str(int(signal.SIGKILL))]  # exec'd, and armed
    gone = subprocess.run([*guard, "1", "--", *show], capture_output=True, text=True, timeout=120)
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr == "drivetrain: the launcher (pid 1) ended before this process started\n"
    missing = subprocess.run(
        [*guard, str(os.getpid()), "--", str(tmp_path / "no-such-program")], capture_output=True, text=True
    )
    assert missing.returncode == 127
    assert (
        missing.stderr
        == f"drivetrain: cannot run {str(tmp_path / 'no-such-program')!r}: No such file or directory\n"
    )
