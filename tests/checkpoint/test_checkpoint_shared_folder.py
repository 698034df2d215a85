"""A folder is shared with the user (issue 29, finding 1): ``save_state(folder)`` into an existing folder
writes and replaces only the files a checkpoint consists of and keeps every other file and subfolder, as
Accelerate does. The crash side of the rule is in tests/checkpoint/test_checkpoint_crash.py."""

from __future__ import annotations

import os

import pytest
import torch

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint import publishing
from drivetrain.errors import CheckpointError, CheckpointWarning
from drivetrain.utils import ProjectConfiguration, set_seed

ACCELERATE_LAYOUT = {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"}


def _setup(project_dir):
    set_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(project_dir)))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def _step(accelerator, model, optimizer, scheduler):
    accelerator.backward(model(torch.randn(4, 8)).sum())
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _weights(model):
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _tree(folder):
    """Every file under ``folder`` with its bytes, and every folder (as None)."""
    found = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), folder)] = None
        for name in names:
            with open(os.path.join(root, name), "rb") as handle:
                found[os.path.relpath(os.path.join(root, name), folder)] = handle.read()
    return found


def test_save_state_into_an_existing_folder_keeps_the_users_files_and_subfolders(tmp_path):
    output_dir = tmp_path / "output"
    (output_dir / "data" / "raw").mkdir(parents=True)
    (output_dir / "notes.txt").write_text("hyper-parameters I tried")
    (output_dir / "data" / "train.csv").write_text("x,y\n1,2\n")
    (output_dir / "data" / "raw" / "part-0").write_bytes(os.urandom(1000))
    os.symlink("/etc/hostname", output_dir / "link-to-elsewhere")  # the user's link, not the checkpoint's
    users = _tree(output_dir)

    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    _step(accelerator, model, optimizer, scheduler)
    first = _weights(model)
    assert accelerator.save_state(output_dir) == str(output_dir)
    _step(accelerator, model, optimizer, scheduler)
    second = _weights(model)
    accelerator.save_state(output_dir)  # over the first checkpoint, in the same folder

    after = _tree(output_dir)
    assert {name: after.get(name) for name in users} == users, "a user's file or folder changed"
    # The first checkpoint's files went into a trash folder beside output_dir, deleted in the background.
    publishing.wait_for_discards()
    assert [name for name in os.listdir(tmp_path) if "drivetrain-trash" in name] == []
    # When save_state returns the folder holds Accelerate's layout (plus the manifest) beside the user's files.
    assert set(after) - set(users) == ACCELERATE_LAYOUT | {manifests.MANIFEST_NAME}
    assert set(manifests.verify(str(output_dir))["files"]) == ACCELERATE_LAYOUT

    _step(accelerator, model, optimizer, scheduler)
    accelerator.load_state(output_dir)
    assert all(torch.equal(second[name], value) for name, value in model.state_dict().items())
    assert not all(torch.equal(first[name], value) for name, value in model.state_dict().items())


def test_save_state_into_the_working_directory_keeps_the_training_script(tmp_path, monkeypatch):
    """``save_state(".")`` from the folder the training script lives in: the script stays."""
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    accelerator.save_state(".")
    accelerator.save_state(".")
    assert script.read_text() == "print('training')\n"
    assert ACCELERATE_LAYOUT <= set(os.listdir(tmp_path))
    accelerator.load_state(".")


def test_a_resave_removes_only_the_previous_checkpoints_own_files(tmp_path):
    """A checkpoint saved with safetensors, then again without: the old model.safetensors (listed in the
    previous manifest) goes; a weights file the user put there, which no manifest listed, stays."""
    output_dir = tmp_path / "output"
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    accelerator.save_state(output_dir)
    (output_dir / "model_1.safetensors").write_bytes(b"the user's own file")
    accelerator.save_state(output_dir, safe_serialization=False)
    names = set(os.listdir(output_dir))
    assert "pytorch_model.bin" in names and "model.safetensors" not in names
    assert (output_dir / "model_1.safetensors").read_bytes() == b"the user's own file"
    accelerator.load_state(output_dir)


def test_a_file_where_the_folder_should_be_is_refused_and_kept(tmp_path):
    target = tmp_path / "output"
    target.write_text("not a folder")
    accelerator, *_ = _setup(tmp_path)
    with pytest.raises(CheckpointError, match="output: it is a file, not a folder"):
        accelerator.save_state(target)
    assert target.read_text() == "not a folder"


def test_pruning_an_automatic_checkpoint_keeps_a_file_the_user_added_to_it(tmp_path):
    set_seed(0)
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=1)
    accelerator = Accelerator(project_config=config)
    accelerator.prepare(torch.nn.Linear(4, 2))
    first = accelerator.save_state()
    with open(os.path.join(first, "eval_results.json"), "w") as out:
        out.write('{"accuracy": 0.9}')
    with pytest.warns(CheckpointWarning, match=r"kept eval_results.json, which the checkpoint's manifest"):
        accelerator.save_state()
    assert os.listdir(first) == ["eval_results.json"]  # the checkpoint's own files are gone, the user's kept
    assert not manifests.is_complete(first)


def test_a_folder_where_a_checkpoint_file_goes_is_refused_before_anything_changes(tmp_path):
    """A user's folder named like a checkpoint file: the save is refused before its commit, so the previous
    checkpoint and the user's folder are both as they were."""
    output_dir = tmp_path / "output"
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    accelerator.save_state(output_dir)
    before = _tree(output_dir)
    os.remove(output_dir / "scheduler.bin")
    (output_dir / "scheduler.bin").mkdir()
    (output_dir / "scheduler.bin" / "mine.txt").write_text("kept")
    _step(accelerator, model, optimizer, scheduler)
    with pytest.raises(CheckpointError, match=r"the checkpoint file scheduler.bin would replace a folder"):
        accelerator.save_state(output_dir)
    after = _tree(output_dir)
    assert (output_dir / "scheduler.bin" / "mine.txt").read_text() == "kept"
    assert {k: v for k, v in after.items() if not k.startswith("scheduler.bin")} == {
        k: v for k, v in before.items() if k != "scheduler.bin"
    }
