"""fp8 (torchao) composed with ddp and fsdp in 2 real processes (gloo on loopback).

Each launch runs several checks (scripts/fp8_checks.py); the test asserts every expected check reported ok.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from drivetrain.testing import assert_checks_passed, launch_script

SCRIPT = str(Path(__file__).parent / "scripts" / "fp8_checks.py")


@pytest.mark.multiprocess
def test_fp8_then_ddp_equals_one_process(launch_env):
    """The model is converted, then wrapped in DDP; 2 processes x 16 rows train like 1 process on 32 rows
    (within the float8 scaling tolerance stated in the script) and the replicas stay bitwise equal."""
    result = launch_script(SCRIPT, num_processes=2, args=["ddp"], env=launch_env)
    assert_checks_passed(result, ["fp8_then_ddp", "replicas_equal", "ddp_equal_to_one_process"])


@pytest.mark.multiprocess
def test_fp8_then_fsdp_with_float8_all_gather(launch_env, tmp_path):
    """Converted, then sharded with FSDP2 whose all-gather sends float8 weights; trains like 1 process;
    save_model exports plain weights; a sharded checkpoint resumes exactly."""
    result = launch_script(
        SCRIPT, num_processes=2, args=["fsdp", str(tmp_path / "checkpoint")], env=launch_env
    )
    assert_checks_passed(
        result,
        [
            "fp8_then_fsdp",
            "float8_all_gather",
            "optimizer_holds_sharded_weights",
            "fsdp_equal_to_one_process",
            "fsdp_save_model_plain",
            "fsdp_resume_exact",
        ],
    )
