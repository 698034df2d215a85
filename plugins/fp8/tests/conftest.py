"""Test setup for the fp8 plugin (the repository's conftest.py resets drivetrain state around each test)."""

from __future__ import annotations

import logging

import pytest

# torchao logs at import that its CUDA kernels do not load on a CPU-only torch; that is expected here.
logging.getLogger("torchao").setLevel(logging.ERROR)


@pytest.fixture
def launch_env(tmp_path):
    """Environment for launched processes: the launcher's temporary folders go under the test's tmp dir."""
    return {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}


@pytest.fixture
def launched_fp8(monkeypatch):
    """Pretend the launcher handed these ``--fp8_*`` settings to this process."""
    import json

    def set_options(**values):
        monkeypatch.setenv("DRIVETRAIN_PLUGIN_OPTIONS", json.dumps({"fp8": values}))

    return set_options
