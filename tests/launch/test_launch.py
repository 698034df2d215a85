"""`drivetrain launch` and the Python launchers with real processes (gloo on loopback)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drivetrain.commands.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
pytestmark = pytest.mark.multiprocess


def launch(*args, tmp_path, env=None, timeout=180):
    """Start ``drivetrain launch`` in ``tmp_path``, with ``tmp_path/tmp`` as its (empty) temporary folder."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path / "tmp"),
        # torch's per-user compile cache (made in the temporary folder by any script that builds an
        # optimizer) is not the launcher's: kept out of the folder the tests check
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache"),
        "PYTHONUNBUFFERED": "1",
        "DRIVETRAIN_CONFIG_DIR": str(tmp_path / "no-config"),
        **(env or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "drivetrain.launch", *map(str, args)],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )


def finish(process, timeout=180):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def test_cpu_two_processes_with_exported_settings(tmp_path):
    report = tmp_path / "report.json"
    code, out, err = finish(
        launch(
            "--cpu",
            "--num-processes",
            "2",
            "--mixed_precision",
            "bf16",
            "--gradient-accumulation-steps",
            "2",
            "--debug",
            "--env",
            "TEST_GREETING=hi",
            "--num_cpu_threads_per_process",
            "1",
            "--monitor_interval",
            "0.2",
            SCRIPTS / "launch_report.py",
            report,
            "--lr",
            "0.1",
            tmp_path=tmp_path,
        )
    )
    assert code == 0, err
    assert (
        "drivetrain launch: backend ddp (automatic), 2 processes on 1 machine" in err
        and "precision bf16" in err
    )
    ranks = json.loads(report.read_text())
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world"] for r in ranks} == {2}
    assert {r["backend"] for r in ranks} == {"ddp"}
    exported = {k: v for k, v in ranks[0]["env"].items() if k != "DRIVETRAIN_CONFIG_DIR"}
    # Where the processes report an uncaught error and their backend to the launcher: a loopback socket
    # and its token, no file (a killed launcher could not remove one)
    assert re.fullmatch(r"127\.0\.0\.1:\d+:[0-9a-f]{32}", exported.pop("DRIVETRAIN_LAUNCH_CHANNEL"))
    assert os.listdir(tmp_path / "tmp") == []  # nor torchelastic_* folders: nothing in the temporary folder
    assert exported == {
        "DRIVETRAIN_CPU": "1",
        "DRIVETRAIN_MIXED_PRECISION": "bf16",
        "DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS": "2",
        "DRIVETRAIN_DEBUG_MODE": "1",
        "TEST_GREETING": "hi",
    }
    assert ranks[1]["argv"] == ["--lr", "0.1"] and ranks[1]["omp"] == "1"
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP synchronised different data


def test_the_launcher_reports_the_backend_the_script_selected(tmp_path):
    """The banner can only announce the automatic backend; when the script picks another, the launcher says
    which one the processes used once they ran."""
    script = tmp_path / "picks.py"
    script.write_text(
        "from drivetrain import Accelerator\nAccelerator(backend='bf16-ddp', cpu=True).end_training()\n"
    )
    code, _, err = finish(launch("--cpu", "--num_processes", "2", script, tmp_path=tmp_path))
    assert code == 0, err
    assert "drivetrain launch: backend ddp (automatic), 2 processes" in err
    assert (
        "drivetrain launch: the script used backend bf16-ddp (from Accelerator(backend='bf16-ddp')), "
        "not ddp (automatic)" in err
    )


def test_script_argument_contradicting_a_flag_is_an_error_naming_both(tmp_path):
    code, out, err = finish(
        launch("--mixed_precision", "fp16", SCRIPTS / "launch_conflict.py", tmp_path=tmp_path)
    )
    assert code != 0 and "no conflict detected" not in out
    assert "conflicting 'mixed_precision'" in err and "Accelerator(mixed_precision='bf16')" in err
    assert "DRIVETRAIN_MIXED_PRECISION=fp16" in err


def test_no_python_with_backend_flag(tmp_path):
    code, out, err = finish(
        launch(
            "--no_python",
            "--backend",
            "local",
            "--quiet",
            "sh",
            "-c",
            "echo rank=$RANK backend=$DRIVETRAIN_BACKEND",
            tmp_path=tmp_path,
        )
    )
    assert code == 0, err
    assert "rank=0 backend=local" in out and "drivetrain launch:" not in err


def test_drivetrain_test_runs_self_check_with_the_users_config(tmp_path):
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "default_config.yaml").write_text("num_processes: 2\nuse_cpu: true\n")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "DRIVETRAIN_CONFIG_DIR": str(config),
    }
    result = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "test"],
        env=env,
        text=True,
        capture_output=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "drivetrain self-check: 2 process(es), backend ddp" in result.stdout
    assert "Test is a success!" in result.stdout


def test_two_machines_on_loopback(tmp_path):
    port = free_port()
    common = [
        "--cpu",
        "--num_processes",
        "4",
        "--num_machines",
        "2",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        port,
    ]
    report = tmp_path / "report.json"
    machines = [
        launch(*common, "--machine_rank", rank, SCRIPTS / "launch_report.py", report, tmp_path=tmp_path)
        for rank in (0, 1)
    ]
    results = [finish(machine) for machine in machines]
    for code, _, err in results:
        assert code == 0, err
    assert "4 processes on 2 machines (2 here, cpu), this is machine 1" in results[1][2]
    ranks = json.loads(report.read_text())
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["world"] for r in ranks} == {4}
    assert [r["machine_rank"] for r in ranks] == [0, 0, 1, 1]
    assert all(r["weights"] == ranks[0]["weights"] for r in ranks)


def test_crashed_rank_restarts_group_and_resumes_to_same_weights(tmp_path):
    pytest.importorskip("drivetrain.accelerator")
    example = ROOT / "examples" / "fault_tolerant_training.py"
    runs = {}
    for name, extra in (("clean", []), ("crashed", ["--crash_at_step", "5"])):
        out_dir = tmp_path / name
        code, out, err = finish(
            launch(
                "--cpu",
                "--num_processes",
                "2",
                "--max_restarts",
                "1",
                example,
                "--output_dir",
                out_dir,
                *extra,
                tmp_path=tmp_path,
            )
        )
        assert code == 0, err
        runs[name] = (out_dir, out, err)
    crashed_dir, crashed_out, crashed_err = runs["crashed"]
    # Rank 1 exits with 17; rank 0, whose collective then fails, exits with 1 at once (failure_report), so
    # the launcher may notice either first: what matters is that the group failed once and was restarted.
    assert (crashed_dir / "crashed_once").exists() and re.search(r"failed \(exitcode: (17|1)\)", crashed_err)
    assert "resumed from" in crashed_out and "step_3 at step 3" in crashed_out
    clean = torch.load(runs["clean"][0] / "final_weights.pt")
    resumed = torch.load(crashed_dir / "final_weights.pt")
    assert clean.keys() == resumed.keys()
    assert all(torch.equal(clean[key], resumed[key]) for key in clean)


def test_a_crash_without_restarts_fails_with_the_exit_code(tmp_path):
    code, out, err = finish(
        launch(
            "--cpu",
            "--num_processes",
            "2",
            "--no_python",
            "sh",
            "-c",
            "exit $((RANK * 3))",
            tmp_path=tmp_path,
        )
    )
    assert code == 3
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("drivetrain: error: process of global rank 1 failed first (exit code 3)")
    )


def _gather_rank(tag):
    from drivetrain.state import PartialState

    state = PartialState()
    seen = state.collectives.all_gather_object(
        (state.process_index, tag, os.environ.get("DRIVETRAIN_MIXED_PRECISION"), state.device.type)
    )
    state.destroy_process_group()
    return seen


def test_debug_launcher_and_notebook_launcher_fork_real_processes(tmp_path, monkeypatch):
    import tempfile

    from drivetrain.launchers import debug_launcher, notebook_launcher

    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # gettempdir() caches its first answer
    results = debug_launcher(_gather_rank, ("dbg",), num_processes=2)
    assert results[0] == results[1] == [(0, "dbg", None, "cpu"), (1, "dbg", None, "cpu")]
    results = notebook_launcher(
        _gather_rank, ("nb",), num_processes=2, mixed_precision="bf16", use_port=free_port()
    )
    assert results[1] == [(0, "nb", "bf16", "cpu"), (1, "nb", "bf16", "cpu")]
    assert "DRIVETRAIN_MIXED_PRECISION" not in os.environ  # restored after the launch
    assert os.listdir(tmp_path / "tmp") == []  # torch's elastic launcher made no torchelastic_* folder
    # one process runs in place
    assert notebook_launcher(lambda: "here", num_processes=1) == "here"
    with pytest.raises(ValueError, match="mixed_precision='fp12' is not valid"):
        notebook_launcher(_gather_rank, ("x",), num_processes=2, mixed_precision="fp12")


def test_a_rank_that_raises_is_named_first_with_its_error_and_no_abort(tmp_path):
    """The short version of ``python scripts/ddp_exit_stress.py --runs 20 --failing_rank 1`` (which stands
    behind "20 of 20 runs"): each run ends with exit code 1, no gloo abort, and the launcher's last line
    naming rank 1 and its ValueError, although rank 0 fails too, waiting for it."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "ddp_exit_stress.py"
    spec = importlib.util.spec_from_file_location("ddp_exit_stress", path)
    stress = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stress)
    outcomes = stress.run_failing(runs=2, failing_rank=1)
    assert outcomes == [(1, ""), (1, "")], outcomes


def test_sigterm_stops_the_job_with_one_line(tmp_path):
    import signal
    import time

    started = tmp_path / "started"
    process = launch(
        "--cpu",
        "--num_processes",
        "2",
        "--no_python",
        "sh",
        "-c",
        f"touch {started}.$RANK; sleep 120",
        tmp_path=tmp_path,
    )
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"started.{rank}").exists() for rank in (0, 1)):
        assert time.monotonic() < deadline and process.poll() is None, "the job did not start"
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    code, out, err = finish(process, timeout=60)
    assert code == 128 + signal.SIGTERM
    assert "Traceback" not in err
    assert (
        err.strip().splitlines()[-1]
        == "drivetrain: error: stopped by SIGTERM: the job's processes were stopped"
    )
