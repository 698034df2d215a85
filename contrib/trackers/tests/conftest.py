"""Tracker tests run in their own folder (the repository's conftest.py resets drivetrain state)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def in_own_folder(monkeypatch, tmp_path):
    """Tracker libraries write next to the working directory (MLflow's ./mlruns artifacts, DVC's repository
    files when the folder is a git repository): keep that out of the checkout."""
    monkeypatch.chdir(tmp_path)
