"""Training on torch_xla's CPU device against the reference backend (needs the pinned xla env:
scripts/test-xla). Tolerances: fp32 weights within 1e-5 of ``local`` after 6 steps (measured: ~1e-7);
bf16 within 2e-2 of ``local``'s bf16 on the CPU (XLA and the CPU round bf16 matmuls differently)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.needs_xla

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 2e-2


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, xla_check):
    return xla_check(tmp_path_factory.mktemp("one"), "one")


@pytest.fixture(scope="module")
def spmd(tmp_path_factory, xla_check):
    return xla_check(tmp_path_factory.mktemp("spmd"), "spmd", devices=2)


def test_the_xla_device_selects_the_xla_backend(one_device):
    assert one_device["device"] == "xla:0"
    assert one_device["backend"] == "xla"
    assert one_device["backend_source"] == "automatic (device xla)"
    assert one_device["distributed_type"].endswith("XLA")
    assert one_device["available"] is True and one_device["is_tpu"] is False


def test_one_device_trains_like_local(one_device):
    assert one_device["max_weight_difference"] < FP32_TOLERANCE
    assert one_device["max_loss_difference"] < FP32_TOLERANCE


def test_a_prepared_loop_compiles_once_not_per_step(one_device):
    counts = one_device["compiles_per_step"]
    assert len(counts) == 6
    # the first step compiles; the steps after it run the cached graph
    assert counts[-1] == counts[1] <= 3, counts


def test_save_state_writes_cpu_files_and_resume_finishes_identically(one_device):
    assert {"model.safetensors", "optimizer.bin", "dl_state_dict.bin"} <= set(one_device["checkpoint_files"])
    assert one_device["resumed_batches"] == 3
    assert one_device["resume_difference"] < 1e-7
    assert one_device["save_model_difference"] == 0.0


def test_collectives_with_one_device(one_device):
    assert one_device["gather"] == [0, 1, 2]
    assert one_device["reduce"] == 2.0


def test_weight_tying_survives_the_move_to_the_device(one_device):
    assert one_device["tied_after_prepare"] is True
    assert one_device["tied_device"] == "xla:0"


def test_bf16_on_the_xla_device(one_device):
    assert one_device["bf16_difference"] < BF16_TOLERANCE
    assert one_device["bf16_vs_fp32"] < BF16_TOLERANCE


def test_gradient_accumulation_matches_local_without_recompiling(one_device):
    assert one_device["accumulation_difference"] < FP32_TOLERANCE
    counts = one_device["accumulation_compiles"]
    assert counts[-1] == counts[3], counts  # micro-step and step graphs are compiled once each


def test_spmd_over_two_devices_trains_like_local_on_the_global_batch(spmd):
    assert spmd["is_spmd"] is True and spmd["devices"] == 2 and spmd["num_processes"] == 1
    assert spmd["input_sharding"] == "{devices=[2,1]0,1}"  # [batch, features]: the batch is split
    assert spmd["label_sharding"] == "{devices=[2]0,1}"  # a 1-D batch of labels too
    assert spmd["max_weight_difference"] < FP32_TOLERANCE
    counts = spmd["compiles_per_step"]
    # steady after the step that saved a checkpoint (its cut comes at another point of the step)
    assert counts[-1] == counts[3] <= 4, counts


def test_spmd_save_and_resume(spmd):
    assert spmd["resume_difference"] < 1e-7


def test_fsdp_via_spmd_shards_parameters_and_trains_like_local(spmd):
    assert spmd["fsdp_parameter_sharding"] == "{devices=[2,1]0,1}"
    assert spmd["fsdp_difference"] < FP32_TOLERANCE
    counts = spmd["fsdp_compiles_per_step"]
    assert counts[-1] == counts[1], counts


def test_torchrun_processes_are_refused_rather_than_silently_wrong(tmp_path, xla_check):
    error = xla_check(tmp_path, "torchrun")["error"]
    assert error is not None and "torch_xla sees 1 replica" in error and "drivetrain launch --tpu" in error


@pytest.mark.xfail(
    reason=(
        "upstream torch_xla 2.9 limitation: on the CPU device several replicas run as threads of one process "
        "and their first all-reduce never meets (rendezvous op_ids differ; XLA aborts the pool process and "
        "xmp.spawn raises BrokenProcessPool). SPMD is the multi-device mode tested on CPU"
    ),
    strict=False,
)
def test_several_replicas_on_the_cpu_device_all_reduce(tmp_path, xla_check):
    sums = xla_check(tmp_path, "replicas", devices=2, timeout=120)["sums"]
    assert sums == [3.0, 3.0]


@pytest.mark.slow  # two launches, each starting torch_xla (about a minute each on a busy machine)
def test_launch_tpu_runs_the_main_training_function_under_torch_xla(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "tpu_launch_script.py"
    env = {**os.environ, "PJRT_DEVICE": "CPU", "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    launch = [sys.executable, "-m", "drivetrain.commands.main", "launch", "--tpu"]
    called = subprocess.run(
        [*launch, "--main_training_function", "main", "--mixed_precision", "bf16", str(script), "--lr", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert called.returncode == 0, called.stderr[-3000:]
    assert "as __main__" not in called.stdout  # imported, and main() called by torch_xla's launcher
    assert "RESULT xla xla:0 bf16 ['--lr', '3']" in called.stdout
    as_main = subprocess.run([*launch, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert as_main.returncode == 0, as_main.stderr[-3000:]
    assert "as __main__\nRESULT xla xla:0 no []" in as_main.stdout
