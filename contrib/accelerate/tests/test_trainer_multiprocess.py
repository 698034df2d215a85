"""Trainer on 2 CPU processes through ``accelerate launch --cpu --num_processes 2`` (drivetrain's launcher),
plain (DDP) and on the backend plugins (``TrainingArguments(deepspeed=...)`` ZeRO-2 and ZeRO-3,
``TrainingArguments(fsdp=...)`` FSDP2): train, save, resume. A resumed run equals the uninterrupted one; the
uninterrupted run's losses equal the reference's (reference_runs.json, recorded with Accelerate 1.15.0 and the
same transformers, torch and deepspeed by ``python hf_runs.py --reference PYTHON``).

Slow (each case launches three 2-process runs): run by ``scripts/test-hf-stack``, skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multiprocess,
    pytest.mark.skipif(
        os.environ.get("HF_STACK_SLOW") != "1",
        reason="2-process Trainer runs (~8 min): scripts/test-hf-stack runs them (HF_STACK_SLOW=1)",
    ),
]


def _runs():
    spec = importlib.util.spec_from_file_location("hf_runs", HERE / "hf_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = json.loads((HERE / "reference_runs.json").read_text())


@pytest.mark.parametrize("name", ["trainer-2", "zero2-2", "zero3-2", "fsdp2-2"])
def test_trainer_on_two_processes_trains_saves_and_resumes_as_the_reference(name, tmp_path):
    pytest.importorskip("transformers")
    if name.startswith("zero"):
        pytest.importorskip("deepspeed")
    runs = _runs()
    full = runs.launch(name, tmp_path / "full")
    stopped = runs.launch(name, tmp_path / "resumed", extra=("--stop-at", "8"))
    checkpoint = tmp_path / "resumed" / "out" / "checkpoint-8"
    resumed = runs.launch(name, tmp_path / "resumed", extra=("--resume", str(checkpoint)))

    assert full["num_processes"] == 2 and full["accelerate_module"] == "drivetrain"
    assert full["global_step"] == 16 and stopped["global_step"] == 8 and resumed["global_step"] == 16
    assert "checkpoint-8" in full["checkpoints"] and "checkpoint-16" in full["checkpoints"]
    later = [str(step) for step in range(9, 17)]
    assert [resumed["losses"][s] for s in later] == [full["losses"][s] for s in later]
    assert resumed["weights_sha256"] == full["weights_sha256"]
    assert resumed["eval_loss"] == full["eval_loss"]

    reference = REFERENCE["runs"][name]
    assert "failed" not in reference, reference
    # the same numbers as Accelerate's run, to the 4 decimals the Trainer prints
    assert full["losses"] == pytest.approx(reference["losses"], abs=1e-4)
    assert full["eval_loss"] == pytest.approx(reference["eval_loss"], abs=1e-4)


def test_two_processes_equal_one_process_with_the_same_global_batch(tmp_path):
    pytest.importorskip("transformers")
    runs = _runs()
    two = runs.launch("trainer-2", tmp_path / "two")
    one = runs.launch("trainer-1", tmp_path / "one")
    assert one["num_processes"] == 1 and two["num_processes"] == 2
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-4)
    assert one["losses"] == pytest.approx(REFERENCE["runs"]["trainer-1"]["losses"], abs=1e-4)
