"""A checkpoint as a hostile or unlucky user meets it (issue 23): pruning that fails, files that would run
code or read outside the folder, tampered manifests, loads that fail half way, saves that fail."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.errors import CheckpointError, CheckpointWarning
from drivetrain.utils import ProjectConfiguration, set_seed


def _setup(tmp_path, optimizer_groups=1, **config):
    set_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path), **config))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    if optimizer_groups == 1:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    else:
        optimizer = torch.optim.AdamW(
            [{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.01}], lr=0.1
        )
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _step(accelerator, model, optimizer):
    accelerator.backward(model(torch.randn(3, 4)).sum())
    optimizer.step()
    optimizer.zero_grad()


def _weights(model):
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


# -- pruning is not part of the save (finding 2) ----------------------------------------------------------
def test_failed_prune_is_a_warning_and_later_saves_go_on(tmp_path):
    """The oldest checkpoint replaced by a symbolic link (to a copy elsewhere): pruning cannot and must
    not delete it, yet every save is reported written, nothing is renamed and numbering goes on."""
    accelerator, model, optimizer = _setup(tmp_path, automatic_checkpoint_naming=True, total_limit=2)
    root = tmp_path / "checkpoints"
    accelerator.save_state()
    elsewhere = tmp_path / "kept_elsewhere"
    shutil.move(root / "checkpoint_0", elsewhere)
    os.symlink(elsewhere, root / "checkpoint_0")
    accelerator.save_state()
    with pytest.warns(CheckpointWarning, match=r"checkpoint_0 \(a symbolic link") as caught:
        location = accelerator.save_state()
    assert "checkpoint_2 is complete" in str(caught[0].message)
    assert location == str(root / "checkpoint_2") and manifests.is_complete(location)
    assert os.path.islink(root / "checkpoint_0") and manifests.is_complete(str(elsewhere))
    assert not any(name.endswith(".incomplete") for name in os.listdir(root))
    with pytest.warns(CheckpointWarning):
        assert accelerator.save_state() == str(root / "checkpoint_3")  # no "already exists"
    assert sorted(os.listdir(root)) == ["checkpoint_0", "checkpoint_2", "checkpoint_3"]
    assert accelerator.project_configuration.iteration == 4


def test_failed_prune_in_background_save_is_a_warning(tmp_path):
    accelerator, model, optimizer = _setup(
        tmp_path, automatic_checkpoint_naming=True, total_limit=1, async_save=True
    )
    root = tmp_path / "checkpoints"
    accelerator.save_state()
    accelerator.wait_for_checkpoint()
    shutil.move(root / "checkpoint_0", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", root / "checkpoint_0")
    accelerator.save_state()
    with pytest.warns(CheckpointWarning, match="checkpoint_0"):
        accelerator.wait_for_checkpoint()
    assert manifests.is_complete(str(root / "checkpoint_1"))
    assert accelerator.save_state() == str(root / "checkpoint_2")
    with pytest.warns(CheckpointWarning, match="checkpoint_0"):
        accelerator.wait_for_checkpoint()
