"""Test setup for the deepspeed plugin: the compiled-op cache, launch environments, one-process runs.

DeepSpeed compiles a C++ op for its CPU communication on first use (about 30 s to 3 min); it is kept in
``TORCH_EXTENSIONS_DIR`` (default here: ~/.cache/drivetrain/torch_extensions, which CI caches too).
"""

from __future__ import annotations

import os
import socket

import pytest

EXTENSIONS_DIR = os.environ.get(
    "TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "drivetrain", "torch_extensions")
)
pytest.importorskip("deepspeed", reason="drivetrain-deepspeed tests need the deepspeed package")


@pytest.fixture
def launch_env(tmp_path):
    """Environment of launched processes: their temporary folders and checkpoints under the test's tmp dir."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    return {
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": EXTENSIONS_DIR,
        "DS_ACCELERATOR": "cpu",
        "DRIVETRAIN_BACKEND": "deepspeed",
        "DS_TEST_CHECKPOINTS": str(checkpoints),
    }


@pytest.fixture
def one_process(monkeypatch):
    """A real one-process deepspeed run inside the test (gloo group of one), torn down afterwards."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "DS_ACCELERATOR": "cpu",
        "TORCH_EXTENSIONS_DIR": EXTENSIONS_DIR,
    }.items():
        monkeypatch.setenv(name, value)
    yield
    from drivetrain_deepspeed.process_group import shutdown_process_group

    from drivetrain.state import reset_state

    reset_state()
    shutdown_process_group()
