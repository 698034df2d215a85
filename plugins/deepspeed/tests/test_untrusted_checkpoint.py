"""A DeepSpeed checkpoint from someone else runs no code: the engine's own files, which DeepSpeed reads with
``torch.load(weights_only=False)``, are read safely by ``load_state`` (issue 23, finding 1 / point 3)."""

from __future__ import annotations

import os

import pytest
import torch

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.errors import CheckpointError
from drivetrain.utils import DeepSpeedPlugin

pytestmark = pytest.mark.usefixtures("one_process")


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(
    "victim", ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
)
def test_load_state_refuses_engine_files_that_run_code(tmp_path, victim):
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model = torch.nn.Linear(3, 1)
    batches = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), 4)
    model, optimizer, batches = accelerator.prepare(
        model, torch.optim.AdamW(model.parameters(), lr=0.1), batches
    )
    accelerator.backward(model(torch.randn(4, 3)).sum())
    optimizer.step()
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    accelerator.load_state(folder)  # the genuine checkpoint, with its DeepSpeed records, loads
    accelerator.backward(model(torch.randn(4, 3)).sum())
    optimizer.step()  # the weights now differ from the checkpoint's

    marker = tmp_path / "code_ran"
    path = os.path.join(folder, "pytorch_model", victim)
    torch.save({"module": _RunsCode(str(marker))}, path)
    os.remove(os.path.join(folder, manifests.MANIFEST_NAME))
    manifests.write_manifest(folder, {})  # the attacker hands over the whole folder
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    with pytest.raises(CheckpointError, match=rf"{victim} holds objects that safe loading refuses"):
        accelerator.load_state(folder)
    assert not marker.exists()
    assert all(torch.equal(before[k], v) for k, v in model.module.state_dict().items())


def test_load_state_refuses_an_engine_folder_holding_a_file_the_manifest_does_not_list(tmp_path):
    """DeepSpeed picks the files of an engine's folder by their names: one planted there after the save
    (unlisted in the manifest) would be read with the engine's own, so the load is refused, in one line, with
    the model as it was (issue 29, finding 3)."""
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model = torch.nn.Linear(3, 1)
    batches = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), 4)
    model, optimizer, batches = accelerator.prepare(
        model, torch.optim.AdamW(model.parameters(), lr=0.1), batches
    )
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    accelerator.backward(model(torch.randn(4, 3)).sum())
    optimizer.step()
    planted = os.path.join(folder, "pytorch_model", "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    torch.save({"optimizer_state_dict": {}}, planted)
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    with pytest.raises(
        CheckpointError, match=r"zero_pp_rank_1_mp_rank_00_optim_states.pt is not listed in the"
    ):
        accelerator.load_state(folder)
    assert all(torch.equal(before[k], v) for k, v in model.module.state_dict().items())
    os.remove(planted)
    accelerator.load_state(folder)
