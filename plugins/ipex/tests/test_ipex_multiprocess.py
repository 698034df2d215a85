"""ipex with ddp in 2 real processes (gloo), asked for by ``drivetrain launch --ipex`` (needs IPEX).

Tolerances between 2 processes and 1 process on the combined batches (the script's TOLERANCE): fp32 1e-6
(summation order only; measured 3.0e-8), bf16 2e-3 (bf16 weights and all-reduced bf16 gradients;
measured 6.7e-4).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain.testing import assert_checks_passed

pytestmark = [pytest.mark.needs_ipex, pytest.mark.multiprocess]

SCRIPTS = Path(__file__).parent / "scripts"
CHECKS = [
    f"{precision}_{name}"
    for precision in ("no", "bf16")
    for name in ("ipex_converted_then_ddp_wrapped", "replicas_equal", "equals_one_process")
] + ["no_equals_plain_torch"]


def test_two_processes_with_ddp_match_one_process(launch_env):
    command = [
        sys.executable,
        "-m",
        "drivetrain.launch",
        "--num_processes",
        "2",
        "--ipex",
        "--quiet",
        str(SCRIPTS / "ipex_ddp_checks.py"),
    ]
    result = subprocess.run(
        command, env={**os.environ, **launch_env}, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    assert_checks_passed(result, CHECKS)
    print("\n".join(line for line in result.stdout.splitlines() if line.startswith(("CHECK", "  "))))
