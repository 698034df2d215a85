"""The deepspeed backend in real processes (2 CPU processes, gloo).

One launch runs the whole matrix (each launch plus the deepspeed import costs ~15-30 s): ZeRO 0/1/2/3 in
fp32 and bf16, with and without CPU offload of the optimizer (and of the parameters at stage 3); several
models. The test asserts that every expected check reported ok.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain.testing import assert_checks_passed, launch_script

SCRIPTS = Path(__file__).parent / "scripts"

TRAINING_CASES = [
    "z0-fp32",
    "z0-bf16",
    *[
        f"z{stage}-{precision}{offload}"
        for stage in (1, 2, 3)
        for precision in ("fp32", "bf16")
        for offload in ("", "-offload")
    ],
    "z3-fp32-offload_all",
    "z3-bf16-offload_all",
]
TRAINING_CHECKS = ["is_engine", "matches_ddp", "grad_norm", "resume_exact", "resume_lr"]
MULTI_MODEL_CHECKS = [
    "first_plugin_active",
    "student_config_optimizer",
    "teacher_selected",
    "teacher_is_zero3",
    "teacher_outputs_match_unsharded",
    "student_trained",
    "student_matches_trained_alone",
    "teacher_frozen",
    "config_scheduler_warms_up",
    "engine_folder_per_trained_model",
    "multi_model_load_restores",
    "disjoint_stages",
    "disjoint_seed0_matches_ddp",
    "disjoint_seed3_matches_ddp",
]


def expected_training_checks() -> list[str]:
    expected = [f"{case}_{check}" for case in TRAINING_CASES for check in TRAINING_CHECKS]
    # Exact fp32 runs without offload are also compared with two epochs of DDP after the resume.
    expected += [f"{case}_resumed_matches_ddp" for case in TRAINING_CASES if case.endswith("fp32")]
    return expected


@pytest.mark.multiprocess
def test_zero_matrix_and_several_models(launch_env):
    """Every ZeRO stage x precision x offload trains like DDP (full global batch, accumulation 2, clipping,
    LR schedule), resumes bit-exactly from save_state/load_state, and several models work (frozen ZeRO-3
    teacher + ZeRO-2 student with config optimizer/scheduler; two disjoint models, one Accelerator each)."""
    result = launch_script(
        str(SCRIPTS / "ds_matrix.py"),
        num_processes=2,
        args=[*TRAINING_CASES, "multi_models", "disjoint_models"],
        env=launch_env,
        timeout=600,
    )
    assert_checks_passed(result, expected_training_checks() + MULTI_MODEL_CHECKS)


def _drivetrain_launch(arguments: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "drivetrain.commands.main", "launch", *arguments]
    full_env = {**os.environ, **env}
    full_env.pop("DRIVETRAIN_BACKEND", None)
    result = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


#: The seed's "Scenario 3": a DeepSpeed config whose launch-flag entries are "auto".
AUTO_CONFIG = {
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": "auto",
        "stage3_gather_16bit_weights_on_model_save": "auto",
        "offload_optimizer": {"device": "auto"},
        "offload_param": {"device": "auto"},
    },
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "steps_per_print": 2000000,
}


@pytest.mark.multiprocess
def test_drivetrain_launch_with_deepspeed_options(launch_env, tmp_path):
    """Every DeepSpeed flag of Accelerate's `launch` fills the "auto" entries of `--deepspeed_config_file`
    (the seed's Scenario 3) and reaches the engine through torch's launcher; then the same script through
    DeepSpeed's own launcher with a hostfile."""
    script = str(SCRIPTS / "ds_launched.py")
    ds_config = tmp_path / "ds_config.json"
    ds_config.write_text(json.dumps(AUTO_CONFIG))
    expected = {
        "stage": 3,
        "config": {
            "zero_optimization.stage3_gather_16bit_weights_on_model_save": True,
            "zero_optimization.offload_optimizer.device": "cpu",
            "zero_optimization.offload_param.device": "cpu",
            "gradient_clipping": 0.5,
            "gradient_accumulation_steps": 2,
            "train_micro_batch_size_per_gpu": 2,
            "train_batch_size": 8,
            "steps_per_print": 2000000,
            "bf16.enabled": False,
        },
        "plugin": {"zero3_init_flag": True, "transformer_moe_cls_names": ["Experts"], "zero_stage": 3},
        "moe_leaf": "Experts",
    }
    flags = [
        "--deepspeed_config_file",
        str(ds_config),
        "--zero_stage",
        "3",
        "--gradient_accumulation_steps",
        "2",
        "--gradient_clipping",
        "0.5",
        "--offload_optimizer_device",
        "cpu",
        "--offload_param_device",
        "cpu",
        "--zero3_save_16bit_model",
        "true",
        "--zero3_init_flag",
        "true",
        "--deepspeed_moe_layer_cls_names",
        "Experts",
    ]
    result = _drivetrain_launch(
        ["--num_processes", "2", "--cpu", "--backend", "deepspeed", *flags, script, json.dumps(expected)],
        launch_env,
    )
    checks = ["launched_stage_3", "launched_trains", "launched_moe_leaf"]
    checks += [f"launched_config_{key}" for key in expected["config"]]
    checks += [f"launched_plugin_{name}" for name in expected["plugin"]]
    for name in checks:
        assert f"CHECK {name} ok" in result.stdout, name

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    result = _drivetrain_launch(
        [
            "--num_processes",
            "2",
            "--cpu",
            "--backend",
            "deepspeed",
            "--zero_stage",
            "1",
            "--deepspeed_hostfile",
            str(hostfile),
            script,
            json.dumps({"stage": 1}),
        ],
        launch_env,
    )
    assert "CHECK launched_stage_1 ok" in result.stdout
    assert "CHECK launched_by_deepspeed_runner ok" in result.stdout
    # The script did not call end_training(): the kernel's exit handler (the backend joins through
    # join_process_group) met the other rank and destroyed the group.
    assert "CHECK launched_left_group_at_exit ok" in result.stdout
