"""Each test starts with no drivetrain process state and rediscovers plugins."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def fresh_drivetrain_state(monkeypatch, tmp_path):
    """Also runs each test in its own folder: tracker libraries write next to the working directory
    (MLflow's ./mlruns artifacts, DVC's repository files when the folder is a git repository)."""
    monkeypatch.chdir(tmp_path)
    from drivetrain.plugins import reset_plugin_manager
    from drivetrain.state import reset_state

    for name in list(os.environ):
        if name.startswith("DRIVETRAIN_"):
            monkeypatch.delenv(name, raising=False)
    reset_state()
    reset_plugin_manager()
    yield
    reset_state()
    reset_plugin_manager()
