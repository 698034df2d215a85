"""Test setup for the ddp plugin (the repository's conftest.py resets drivetrain state around each test)."""

from __future__ import annotations

import pytest


@pytest.fixture
def launch_env(tmp_path):
    """Environment for launched processes: the launcher's temporary folders go under the test's tmp dir."""
    return {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
