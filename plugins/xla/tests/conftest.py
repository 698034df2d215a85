"""Test setup for the xla plugin. Tests that need torch_xla (marked ``needs_xla``) run only where it works
with the installed torch: the pinned env (``scripts/test-xla``); elsewhere they are skipped with the reason,
and the header of the run says so. Each training check runs in a subprocess of its own: torch_xla's runtime
(and SPMD mode) is set once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from drivetrain_xla.runtime import torch_xla_problem

SCRIPTS = Path(__file__).parent / "scripts"
PROBLEM = torch_xla_problem()
SKIP_REASON = (
    f"needs torch_xla ({PROBLEM}); run them in the pinned env: scripts/test-xla (docs/xla.md)"
    if PROBLEM
    else ""
)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "needs_xla: needs torch_xla with its torch (the pinned xla env)")


def pytest_collection_modifyitems(config, items) -> None:
    if SKIP_REASON:
        for item in items:
            if item.get_closest_marker("needs_xla"):
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def pytest_report_header(config) -> str | None:
    if SKIP_REASON:
        return f"drivetrain-xla: tests that need torch_xla are skipped here: {SKIP_REASON}"
    return None


def run_check(tmp_path: Path, mode: str, devices: int = 1, timeout: float = 400, **env: str) -> dict:
    """Run ``scripts/xla_checks.py MODE`` on the XLA CPU device in a fresh process; its JSON result."""
    result_file = tmp_path / f"{mode}.json"
    environment = {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": str(devices),
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        **env,
    }
    environment.pop("PYTHONPATH", None)
    completed = subprocess.run(
        [sys.executable, str(SCRIPTS / "xla_checks.py"), mode, str(result_file), str(tmp_path)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if completed.returncode != 0:
        raise AssertionError(f"{mode} failed (exit {completed.returncode}):\n{completed.stderr[-4000:]}")
    return json.loads(result_file.read_text())


@pytest.fixture(scope="session")
def xla_check():
    """:func:`run_check`, for the test modules (conftest is not importable under --import-mode=importlib)."""
    return run_check
