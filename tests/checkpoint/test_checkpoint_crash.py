"""Nothing lost: a saver SIGKILLed at any stage of a save leaves the previous checkpoint loadable, and no
folder that load_state() takes for complete unless it is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint import publishing, rotation
from drivetrain.utils import ProjectConfiguration, set_seed

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "ckpt_crash.py")

# (where the saver dies, the checkpoint load_state() must then pick)
KILL_POINTS = [
    ("file:1", 0),  # one file of checkpoint_1 written
    ("objects_written", 0),  # every file written, nothing sealed
    ("files_synced", 0),  # (in the background from here on) every file durable, no manifest yet
    ("manifest_written", 0),  # manifest complete, folder not yet renamed
    ("renamed", 1),  # checkpoint_1 in place, old one not yet pruned
]


def _fresh_accelerator(project_dir, automatic=True):
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    config = ProjectConfiguration(
        project_dir=str(project_dir), automatic_checkpoint_naming=automatic, total_limit=1
    )
    accelerator = Accelerator(project_config=config)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


@pytest.mark.parametrize(("kill_at", "survivor"), KILL_POINTS, ids=[k for k, _ in KILL_POINTS])
def test_sigkill_during_save_keeps_the_previous_checkpoint(tmp_path, kill_at, survivor):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKPT_KILL_AT": kill_at, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path), "1"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr

    root = tmp_path / "checkpoints"
    complete = [os.path.basename(p) for p in rotation.complete_checkpoints(str(root))]
    assert complete[-1] == f"checkpoint_{survivor}"
    if survivor == 0:
        assert not (root / "checkpoint_1").exists(), "a partial save is visible under its final name"

    accelerator, model, optimizer = _fresh_accelerator(tmp_path)
    loaded = accelerator.load_state()
    assert os.path.basename(loaded) == f"checkpoint_{survivor}"
    expected = torch.load(tmp_path / f"expected_{survivor}.pt", weights_only=True)
    for name, tensor in accelerator.get_state_dict(model).items():
        assert torch.equal(tensor, expected[name]), name
    assert optimizer.state_dict()["state"], "optimizer state was not restored"

    # Training goes on: the next save numbers itself after the loaded one and clears the leftovers.
    assert accelerator.save_iteration == survivor + 1
    saved = accelerator.save_state()
    accelerator.wait_for_checkpoint()
    assert os.path.basename(saved) == f"checkpoint_{survivor + 1}"
    assert sorted(os.listdir(root)) == [rotation.LOCK_NAME, f"checkpoint_{survivor + 1}"]


# Into an existing folder that holds the user's files: (where the saver dies, which save the folder holds).
SHARED_KILL_POINTS = [
    ("file:1", 0),  # one file staged
    ("objects_written", 0),  # every file staged, nothing committed
    ("files_synced", 0),
    ("manifest_written", 0),  # staged manifest complete, not yet committed
    ("committed", 1),  # the commit record is in place, no file moved yet
    ("file_moved", 1),  # one new file in place, the others still old: a mix on disk, rolled forward
    ("published", 1),  # every file and the manifest in place, the commit record not yet removed
]


def _user_files(folder):
    return {
        os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
        for root, _, names in os.walk(folder)
        for name in names
        if not name.endswith((".safetensors", ".bin", ".pkl", ".json")) and ".drivetrain-save" not in root
    }


@pytest.mark.parametrize(("kill_at", "survivor"), SHARED_KILL_POINTS, ids=[k for k, _ in SHARED_KILL_POINTS])
def test_sigkill_during_a_save_into_a_shared_folder_leaves_one_whole_checkpoint_and_the_users_files(
    tmp_path, kill_at, survivor
):
    """save_state(folder) twice into a folder holding the user's files, killed during the second save: the
    folder then loads as the first checkpoint or the second, never a mix, and the user's files are intact."""
    folder = tmp_path / "output"
    (folder / "data").mkdir(parents=True)
    (folder / "notes.txt").write_bytes(b"my notes")
    (folder / "data" / "train.csv").write_bytes(b"a,b\n1,2\n")
    users = _user_files(folder)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKPT_KILL_AT": kill_at, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path), "1", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    assert _user_files(folder) == users

    accelerator, model, optimizer = _fresh_accelerator(tmp_path, automatic=False)
    assert accelerator.load_state(folder) == str(folder)
    expected = torch.load(tmp_path / f"expected_{survivor}.pt", weights_only=True)
    for name, tensor in accelerator.get_state_dict(model).items():
        assert torch.equal(tensor, expected[name]), name
    assert optimizer.state_dict()["state"], "optimizer state was not restored"
    assert manifests.verify(str(folder))

    # The next save into the folder clears what the killed one left and keeps the user's files.
    accelerator.save_state(folder)
    publishing.wait_for_discards()
    leftovers = [name for name in os.listdir(folder) if name.startswith(".drivetrain-save")]
    leftovers += [name for name in os.listdir(tmp_path) if "drivetrain-trash" in name]
    assert leftovers == [] and _user_files(folder) == users
    assert sorted(os.listdir(folder)) == sorted(
        [*manifests.read_manifest(str(folder))["files"], manifests.MANIFEST_NAME, "data", "notes.txt"]
    )
