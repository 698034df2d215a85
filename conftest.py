"""Shared test setup: one thread, and no drivetrain state leaking from one test into the next."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def fresh_drivetrain_state(monkeypatch):
    """Each test starts with no process state and rediscovers plugins; DRIVETRAIN_* variables from the
    developer's shell do not leak in, nor Accelerate's ACCELERATE_* (which set the same settings)."""
    import torch

    from drivetrain.checkpoint import finishing
    from drivetrain.contract.registry import reset_plugin_registry
    from drivetrain.state import reset_state

    for name in list(os.environ):
        if name.startswith(("DRIVETRAIN_", "ACCELERATE_")):
            monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(1)
    reset_state()
    reset_plugin_registry()
    yield
    # A test that ends right after save_state leaves the save finishing in the background: let it end
    # inside the test's time and folders, not during the next test.
    finishing.wait_for_all()
    # Code under test may export DRIVETRAIN_* itself (the launcher does, for the processes it starts); those
    # are not monkeypatch's to undo, so drop them here or the next test runs under them.
    for name in list(os.environ):
        if name.startswith("DRIVETRAIN_"):
            del os.environ[name]
    reset_state()
    reset_plugin_registry()
