"""The fsdp backend in real processes (torch's elastic launcher, gloo on CPU).

One 2-process launch runs every training and checkpoint check (scripts/fsdp_checks.py); two more resume
its sharded checkpoint on 1 process and that one's checkpoint on 2 processes (DCP resharding). The test
asserts that every expected check reported ok, so a check that silently stopped running fails too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drivetrain.commands.main import main as drivetrain_main
from drivetrain.testing import assert_checks_passed, launch_script

SCRIPTS = Path(__file__).parent / "scripts"
STRATEGIES = [
    "full_shard",
    "shard_grad_op",
    "reshard_after_forward_false",
    "no_shard",
    "hybrid_shard",
    "hybrid_shard_replicate",
    "hybrid_shard_zero2",
]
STRATEGY_CHECKS = (
    [
        f"{strategy}_{what}"
        for strategy in STRATEGIES
        for what in ("equals_ddp", "clip_norm_global", "optimizer_rebound")
    ]
    + [
        f"{strategy}_holds_only_its_shard"
        for strategy in STRATEGIES
        if strategy not in ("no_shard", "hybrid_shard_replicate")
    ]
    + ["no_shard_replicated", "hybrid_shard_replicate_replicated", "units_bottom_up", "distributed_type_fsdp"]
)
OTHER_CHECKS = [
    "no_sync_defers_reduce_scatter",
    "accumulate_equals_full_batch",
    "activation_checkpointing_recomputes",
    "activation_checkpointing_same_gradients",
    "activation_checkpointing_same_names",
    "mixed_precision_compute_in_bf16",
    "mixed_precision_sharded_params_fp32",
    "mixed_precision_grads_fp32",
    "mixed_precision_policy_replaces_autocast",
    "ram_efficient_loading_rank0_weights",
    "ram_efficient_loading_buffers",
    "ram_efficient_loading_no_meta",
    "sync_module_states_rank0_weights",
    "optimizer_with_state_refused",
    "sharded_scheduler_restored",
    "sharded_save_load_continue_equals_uninterrupted",
    "sharded_each_rank_writes_its_shard",
    "merge_weights_equals_trained_model",
    "full_scheduler_restored",
    "full_save_load_continue_equals_uninterrupted",
    "full_checkpoint_files",
    "full_state_dict_only_on_rank0",
    "full_state_dict_on_cpu",
]


@pytest.mark.multiprocess
def test_fsdp_training_checkpoints_and_resharding(tmp_path):
    """Every sharding strategy trains like DDP and shards what it should; accumulation, activation
    checkpointing, mixed precision, RAM-efficient loading; SHARDED/FULL save -> load -> continue equals
    uninterrupted; the sharded checkpoint resumes on 1 process and a 1-process one on 2 (DCP resharding);
    `drivetrain merge-weights` equals the trained model."""
    env = {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = launch_script(str(SCRIPTS / "fsdp_checks.py"), num_processes=2, args=[str(tmp_path)], env=env)
    assert_checks_passed(result, STRATEGY_CHECKS + OTHER_CHECKS)

    # 2 -> 1: the 2-process sharded checkpoint continues on one process; it saves one of its own.
    result = launch_script(
        str(SCRIPTS / "fsdp_resume.py"),
        num_processes=1,
        env=env,
        args=[
            str(tmp_path / "sharded"),
            "2",
            str(tmp_path / "expected_after_3.pt"),
            str(tmp_path / "one_process"),
            str(tmp_path / "expected_from_one.pt"),
        ],
    )
    assert_checks_passed(result, ["resume_on_1_equals_uninterrupted", "resume_on_1_scheduler"])
    assert sorted(p.name for p in (tmp_path / "one_process" / "pytorch_model_fsdp_0").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
    ]
    # 1 -> 2
    result = launch_script(
        str(SCRIPTS / "fsdp_resume.py"),
        num_processes=2,
        env=env,
        args=[
            str(tmp_path / "one_process"),
            "2",
            str(tmp_path / "expected_from_one.pt"),
        ],
    )
    assert_checks_passed(result, ["resume_on_2_equals_uninterrupted", "resume_on_2_scheduler"])

    # The CLI merges the 2-process checkpoint into the weights the model had when it was saved.
    assert drivetrain_main(["merge-weights", str(tmp_path / "sharded"), str(tmp_path / "cli_merged")]) == 0
    merged = load_file(str(tmp_path / "cli_merged" / "model.safetensors"))
    at_save = torch.load(tmp_path / "weights_at_save.pt")
    assert merged.keys() == at_save.keys() and all(torch.equal(merged[k], at_save[k]) for k in merged)
