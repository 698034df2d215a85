"""Test setup for the ipex plugin. Tests that need IPEX run only where it can be imported: the pinned env
(``scripts/test-ipex``); elsewhere they are skipped with the reason, and the header of the run says so."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch


def ipex_problem() -> str | None:
    """Why IPEX cannot be used here, judged from package metadata (importing IPEX takes tens of seconds)."""
    try:
        version = metadata.version("intel-extension-for-pytorch")
    except metadata.PackageNotFoundError:
        return "intel-extension-for-pytorch is not installed"
    if version.split(".")[:2] != torch.__version__.split(".")[:2]:
        return f"intel-extension-for-pytorch {version} does not work with torch {torch.__version__}"
    return None


SKIP_REASON = (
    f"needs IPEX ({ipex_problem()}); run them in the pinned env: scripts/test-ipex (docs/ipex.md)"
    if ipex_problem()
    else ""
)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "needs_ipex: needs intel-extension-for-pytorch (the pinned ipex env)")


def pytest_collection_modifyitems(config, items) -> None:
    if SKIP_REASON:
        for item in items:
            if item.get_closest_marker("needs_ipex"):
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def pytest_report_header(config) -> str | None:
    if SKIP_REASON:
        return f"drivetrain-ipex: tests that need IPEX are skipped here: {SKIP_REASON}"
    return None


@pytest.fixture
def launch_env(tmp_path):
    """Environment for launched processes: the launcher's temporary folders go under the test's tmp dir."""
    return {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
