"""What scripts written for Accelerate observe of saving models and states (issue 17's findings of the peer
suite; each test asserts what such a script observes)."""

from __future__ import annotations

import pytest
import torch

from drivetrain import Accelerator


@pytest.mark.parametrize("safe_serialization", [True, False], ids=["safetensors", "pickle"])
def test_save_model_gathers_weights_offloaded_to_cpu_and_disk(tmp_path, safe_serialization):
    pytest.importorskip("drivetrain_offload")
    from drivetrain.big_modeling import load_checkpoint_and_dispatch

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 5)).eval()
    inputs = torch.randn(3, 3)
    expected = model(inputs)
    accelerator = Accelerator(cpu=True)
    accelerator.save_model(model, tmp_path / "plain", safe_serialization=safe_serialization)
    device_map = {"0": "cpu", "1": "disk", "2": "cpu"}
    load_checkpoint_and_dispatch(
        model, tmp_path / "plain", device_map=device_map, offload_folder=tmp_path / "off"
    )
    assert model[1].weight.device.type == "meta"  # held by the offload hook between forwards
    accelerator.save_model(model, tmp_path / "again", safe_serialization=safe_serialization)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 5)).eval()
    load_checkpoint_and_dispatch(fresh, tmp_path / "again")
    assert torch.allclose(fresh(inputs), expected, atol=1e-6)


@pytest.mark.multiprocess
def test_two_ranks_with_their_own_folders_save_and_resume_one_checkpoint(tmp_path):
    pytest.importorskip("torchdata")
    from pathlib import Path

    from drivetrain.testing import launch_script

    script = Path(__file__).parents[1] / "scripts" / "accelerate_behaviour.py"
    result = launch_script(
        str(script), num_processes=2, env={"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    )
    assert result.stdout.count("accelerate_behaviour OK") == 2


def test_save_with_safetensors_says_which_shared_tensors_it_stored_once(tmp_path, caplog):
    from safetensors.torch import load_file

    from drivetrain.utils import save

    model = torch.nn.Module()
    model.a = torch.nn.Linear(3, 3)
    model.b = model.a
    with caplog.at_level("WARNING"):
        save(model.state_dict(), tmp_path / "model.safetensors", safe_serialization=True)
    assert [r.getMessage() for r in caplog.records if "Removed shared tensor" in r.getMessage()] != []
    assert "b.weight" in caplog.text
    assert sorted(load_file(tmp_path / "model.safetensors")) == ["a.bias", "a.weight"]
