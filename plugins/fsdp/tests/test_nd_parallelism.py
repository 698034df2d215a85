"""N-D parallelism on the fsdp backend in real processes (gloo on CPU), each layout compared with the `local`
backend training the same model on the same data (weights within nd_common.TOLERANCE = 2e-5).

Three launches: 4 processes (tp2 x dp_shard2, which saves a checkpoint; HSDP dp_replicate2 x dp_shard2 and
tp2 x dp_replicate2 resuming it), 2 processes (tp2, also resuming it; cp2; FSDP1; a transformers model's own
plan with the size from the environment) and 1 process (resuming the 4-process checkpoint: DCP reshards 4 -> 1;
Accelerate's FSDP helpers and AcceleratorState().fsdp_plugin; activation checkpointing with offload).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from drivetrain.state import reset_state
from drivetrain.testing import assert_checks_passed, launch_script

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def references(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    try:
        from nd_common import train_local

        paths = {}
        for name, sequence in (("flat", False), ("sequence", True)):
            paths[name] = tmp_path / f"local_{name}.pt"
            torch.save(train_local(sequence), paths[name])
            reset_state()
    finally:
        sys.path.remove(str(SCRIPTS))
    return paths


FOUR = [
    "tp2_dp_shard2_equals_local",
    "tp2_dp_shard2_clip_norm_equals_local",
    "tp2_dp_shard2_weight_2d",
    "tp2_dp_shard2_pair_sees_same_batches",
    "tp2_dp_shard2_shares_differ",
    "tp2_dp_shard2_coordinates",
    "gather_for_metrics_each_sample_once",
    "gather_counts_every_rank",
    "hsdp_holds_half_replicated",
    "hsdp_loaded_equals_local",
    "hsdp_resumed_equals_local",
    "hsdp_resumed_clip_norm_equals_local",
    "tp2_dp_replicate2_loaded_equals_local",
    "tp2_dp_replicate2_resumed_equals_local",
    "tp2_dp_replicate2_resumed_clip_norm_equals_local",
    "sizes_not_matching_world_refused",
    "no_flattened_mesh_slicing_warning",
]
TWO = [
    "tp2_equals_local",
    "tp2_clip_norm_equals_local",
    "tp2_weight_split_by_rows",
    "tp2_both_ranks_see_every_batch",
    "tp2_tensor_parallel_rank",
    "tp2_loaded_equals_local",
    "tp2_resumed_equals_local",
    "cp2_shards_the_sequence",
    "cp2_equals_local",
    "cp2_attention_on_cpu_refused",
    *[
        f"fsdp1_{kind}{what}"
        for kind in ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
        for what in ("_wrapper", "_equals_local", "_clip_norm_equals_local", "_resumed_equals_local")
    ],
    "llama_tp_from_environment",
    "llama_own_plan_applied",
    "llama_tp2_equals_local",
    "no_flattened_mesh_slicing_warning",
]


ONE = [
    "one_process_loaded_equals_local",
    "one_process_resumed_equals_local",
    "one_process_resumed_clip_norm_equals_local",
    "state_fsdp_plugin_is_the_runs",
    *[
        f"helpers_{kind}_{what}"
        for kind in ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
        for what in ("files", "loaded_equals_local", "resumed_equals_local", "resumed_clip_norm_equals_local")
    ],
    "set_state_dict_type_drives_save_state",
    "fsdp2_prepare_model_shards",
    "fsdp2_load_full_state_dict_equals_local",
    "activation_checkpointing_offload_equals_local",
    "activation_checkpointing_offload_clip_norm_equals_local",
    "activation_checkpointing_offload_used_save_on_cpu",
]


@pytest.mark.multiprocess
def test_nd_layouts_equal_local_and_resume_across_layouts(tmp_path, references):
    env = {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    common = [str(tmp_path), str(references["flat"])]
    result = launch_script(str(SCRIPTS / "nd_layouts.py"), num_processes=4, args=["four", *common], env=env)
    assert_checks_passed(result, FOUR)
    # The 4-process checkpoint: one DCP file per rank for the model and the optimizer.
    assert sorted(p.name for p in (tmp_path / "tp_dp" / "pytorch_model_fsdp_0").iterdir()) == [
        ".metadata",
        *[f"__{rank}_0.distcp" for rank in range(4)],
    ]

    result = launch_script(
        str(SCRIPTS / "nd_layouts.py"),
        num_processes=2,
        args=["two", *common, str(references["sequence"])],
        env=env,
    )
    assert_checks_passed(result, TWO)

    result = launch_script(str(SCRIPTS / "nd_layouts.py"), num_processes=1, args=["one", *common], env=env)
    assert_checks_passed(result, ONE)
