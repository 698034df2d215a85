"""What users of transformers, peft and trl do most, on drivetrain through ``import accelerate``: a tiny GPT-2
built from a config and a tokenizer trained here (hf_scenarios.py). One process, in this process."""

from __future__ import annotations

import pytest


def run(scenarios, name, tmp_path, *extra):
    return scenarios.main([name, "--out", str(tmp_path / f"{name}.json"), "--workdir", str(tmp_path), *extra])


def test_trainer_train_eval_save_and_resume_continues_exactly(scenarios, tmp_path):
    steps = ["--max-steps", "16", "--save-steps", "8"]
    full = run(scenarios, "trainer", tmp_path / "full", *steps)
    stopped = run(scenarios, "trainer", tmp_path / "resumed", *steps, "--stop-at", "8")
    resumed = run(
        scenarios,
        "trainer",
        tmp_path / "resumed",
        *steps,
        "--resume",
        str(tmp_path / "resumed/out/checkpoint-8"),
    )
    assert full["accelerate_module"] == "drivetrain" and full["accelerate_version"] == "1.15.0"
    assert full["global_step"] == 16 and stopped["global_step"] == 8 and resumed["global_step"] == 16
    assert full["checkpoints"] == ["checkpoint-16", "checkpoint-8"]
    assert full["losses"]["16"] < full["losses"]["1"] - 0.3  # it learns
    # the continuation is the uninterrupted run, step by step and bit for bit
    assert {step: resumed["losses"][step] for step in map(str, range(9, 17))} == {
        step: full["losses"][step] for step in map(str, range(9, 17))
    }
    assert resumed["weights_sha256"] == full["weights_sha256"]
    assert resumed["eval_loss"] == full["eval_loss"]
    assert (tmp_path / "full/final/model.safetensors").is_file()


def test_trainer_bf16_on_cpu_computes_in_bf16(scenarios, tmp_path):
    result = run(scenarios, "trainer", tmp_path, "--max-steps", "8", "--save-steps", "100", "--bf16")
    assert result["mixed_precision"] == "bf16"
    assert result["lm_head_output_dtypes"] == ["torch.bfloat16"]
    assert result["losses"]["8"] < result["losses"]["1"]


def test_peft_lora_through_trainer(scenarios, tmp_path):
    result = run(scenarios, "lora", tmp_path, "--max-steps", "8", "--save-steps", "100", "--lr", "0.05")
    assert result["global_step"] == 8
    assert result["base_unchanged"]
    assert result["lora_tensors"] == 4 and result["lora_tensors_changed"] == 4  # A and B of 2 layers
    assert "adapter_model.safetensors" in result["saved_files"]
    assert result["reload_max_abs_diff"] == 0.0
    assert result["losses"]["8"] < result["losses"]["1"]


def test_trl_sft_trainer(scenarios, tmp_path):
    result = run(scenarios, "sft", tmp_path, "--max-steps", "6")
    assert result["global_step"] == 6
    assert result["reloaded_equal"]
    assert result["losses"]["6"] < result["losses"]["1"]


def test_from_pretrained_device_map_auto_spills_to_disk(scenarios, tmp_path):
    result = run(scenarios, "device_map", tmp_path)
    # the map Accelerate 1.15.0 gives with transformers 5.23.0 (the embedding and the tied head together)
    assert result["device_map"] == {
        "transformer.wte": "cpu",
        "lm_head": "cpu",
        "transformer.wpe": "cpu",
        "transformer.drop": "cpu",
        "transformer.h.0": "cpu",
        "transformer.h.1": "cpu",
        **{f"transformer.h.{i}": "disk" for i in range(2, 8)},
        "transformer.ln_f": "disk",
    }
    assert (
        result["parameters_in_ram"] > 0 and result["parameters_not_in_ram"] > 0
    )  # the disk part stays on disk
    assert result["max_memory_after"] == {"cpu": 300_000}  # converted in place, as transformers expects
    assert result["max_abs_diff"] == pytest.approx(0.0, abs=1e-5)
