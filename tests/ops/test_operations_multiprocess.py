"""Every collective in real processes (torch's elastic launcher, gloo): tests/scripts/ops_collectives.py checks
the documented results; these tests launch it in 2 processes, and in 3 with debug mode on."""

from __future__ import annotations

from pathlib import Path

import pytest

from drivetrain.testing import launch_script

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "ops_collectives.py")

pytestmark = pytest.mark.multiprocess


def run(tmp_path, num_processes: int, debug: bool) -> str:
    env = {"TMPDIR": str(tmp_path), "DRIVETRAIN_DEBUG_MODE": "1" if debug else "0"}
    # A collective that hangs instead of raising makes the launch time out rather than pass.
    result = launch_script(SCRIPT, num_processes=num_processes, env=env, timeout=90)
    return result.stdout


def test_every_collective_on_two_processes(tmp_path):
    out = run(tmp_path, 2, debug=False)
    for rank in range(2):
        assert f"ops_collectives OK rank={rank} world=2 debug=False" in out


def test_debug_mode_raises_on_mismatched_inputs_on_three_processes(tmp_path):
    out = run(tmp_path, 3, debug=True)
    for rank in range(3):
        assert f"ops_collectives OK rank={rank} world=3 debug=True" in out
