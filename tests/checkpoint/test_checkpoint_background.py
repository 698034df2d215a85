"""A save that finishes in the background (opt-in: ``async_save=True`` / ``blocking=False``): save_state
returns once the files are written, training goes on, and the checkpoint appears complete (fsynced,
manifest, renamed) later — with the state of the moment it was saved, never a half-finished folder, and
failures reported at the next checkpoint operation. By default a save is complete when it returns."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from drivetrain import Accelerator
from drivetrain.checkpoint import files, rotation
from drivetrain.checkpoint import manifest as manifests
from drivetrain.errors import CheckpointError
from drivetrain.utils import ProjectConfiguration, set_seed


def _setup(tmp_path, **config):
    config.setdefault("async_save", True)
    set_seed(0)
    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, **config)
    accelerator = Accelerator(project_config=project)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _step(accelerator, model, optimizer):
    accelerator.backward(model(torch.randn(4, 8)).pow(2).sum())
    optimizer.step()
    optimizer.zero_grad()


def _weights(model):
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _hold_at(monkeypatch, stage):
    """Make the finishing thread stop at ``stage`` until the returned event is set."""
    release = threading.Event()
    reached = threading.Event()

    def on_stage(name, path):
        if name == stage:
            reached.set()
            assert release.wait(30), "the test never released the finishing save"

    monkeypatch.setattr(files, "on_stage", on_stage)
    return reached, release


def test_training_goes_on_while_the_save_finishes_and_the_checkpoint_holds_the_saved_state(
    tmp_path, monkeypatch
):
    accelerator, model, optimizer = _setup(tmp_path, checkpoint_sha256=True)
    _step(accelerator, model, optimizer)
    saved = _weights(model)
    reached, release = _hold_at(monkeypatch, "files_synced")
    location = accelerator.save_state()
    assert reached.wait(30)
    # Not complete yet: only the temporary folder exists, and nothing would load it.
    assert not os.path.exists(location)
    assert os.path.isdir(manifests.incomplete_path(location))
    assert rotation.complete_checkpoints(str(tmp_path / "checkpoints")) == []
    for _ in range(3):  # the training loop changes every weight meanwhile
        _step(accelerator, model, optimizer)
    assert any(not torch.equal(saved[k], v) for k, v in model.state_dict().items())
    release.set()
    accelerator.wait_for_checkpoint()
    assert rotation.complete_checkpoints(str(tmp_path / "checkpoints")) == [location]
    manifests.verify(location, checksum="sha256")
    accelerator.load_state()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_load_state_waits_for_the_save_still_finishing(tmp_path, monkeypatch):
    accelerator, model, optimizer = _setup(tmp_path)
    accelerator.save_state(blocking=True)
    _step(accelerator, model, optimizer)
    saved = _weights(model)
    reached, release = _hold_at(monkeypatch, "manifest_written")
    accelerator.save_state()
    assert reached.wait(30)
    _step(accelerator, model, optimizer)
    threading.Timer(0.2, release.set).start()
    assert os.path.basename(accelerator.load_state()) == "checkpoint_1"  # not the older, complete one
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_a_failure_while_finishing_is_raised_at_the_next_wait_and_costs_nothing_earlier(
    tmp_path, monkeypatch
):
    accelerator, model, optimizer = _setup(tmp_path, total_limit=1)
    first = accelerator.save_state(blocking=True)

    def disk_full(name, path):
        if name == "files_synced":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "on_stage", disk_full)
    second = accelerator.save_state()
    with pytest.raises(
        CheckpointError, match=r"finishing save_state into .*checkpoint_1 failed.*No space left"
    ):
        accelerator.wait_for_checkpoint()
    accelerator.wait_for_checkpoint()  # reported once; nothing is pending any more
    assert not os.path.exists(second) and not os.path.exists(manifests.incomplete_path(second))
    assert rotation.complete_checkpoints(str(tmp_path / "checkpoints")) == [first]  # total_limit=1 kept it
    monkeypatch.setattr(files, "on_stage", lambda name, path: None)
    third = accelerator.save_state()
    assert third == second  # the number of the save that was not written is taken again
    accelerator.wait_for_everyone()
    assert rotation.complete_checkpoints(str(tmp_path / "checkpoints")) == [third]


def test_the_next_save_raises_an_unreported_failure_of_the_previous_one(tmp_path, monkeypatch):
    accelerator, model, optimizer = _setup(tmp_path)
    failed = threading.Event()

    def broken(name, path):
        if name == "manifest_written":
            failed.set()
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(files, "on_stage", broken)
    accelerator.save_state()
    assert failed.wait(30)
    monkeypatch.setattr(files, "on_stage", lambda name, path: None)
    with pytest.raises(CheckpointError, match="checkpoint_0 failed.*Input/output error"):
        accelerator.save_state()
    assert os.path.basename(accelerator.save_state(blocking=True)) == "checkpoint_0"


@pytest.mark.parametrize("how", ["blocking", "async_save=False"])
def test_a_blocking_save_is_complete_when_it_returns(tmp_path, monkeypatch, how):
    accelerator, model, optimizer = _setup(tmp_path, **({} if how == "blocking" else {"async_save": False}))
    finished = []
    monkeypatch.setattr(files, "on_stage", lambda name, path: finished.append(name))
    location = accelerator.save_state(blocking=True) if how == "blocking" else accelerator.save_state()
    assert finished == ["objects_written", "files_synced", "manifest_written", "renamed"]
    assert manifests.is_complete(location)


def test_a_script_that_exits_right_after_an_asynchronous_save_state_leaves_a_complete_checkpoint(tmp_path):
    # save_state blocks by default (as Accelerate's does); blocking=False is the opt-in background save
    script = textwrap.dedent(
        """
        import sys, torch
        from drivetrain import Accelerator
        from drivetrain.checkpoint import files
        from drivetrain.utils import ProjectConfiguration

        if sys.argv[2] == "fail":
            def fail(name, path):
                if name == "manifest_written":
                    raise OSError(28, "No space left on device")
            files.on_stage = fail
        # A background save (opt-in): the script ends while it is finishing.
        accelerator = Accelerator(project_config=ProjectConfiguration(async_save=True))
        model = accelerator.prepare(torch.nn.Linear(512, 512))
        torch.save(model.state_dict(), sys.argv[1] + ".expected")
        accelerator.save_state(sys.argv[1], blocking=False)
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    folder = str(tmp_path / "ckpt")
    done = subprocess.run(
        [sys.executable, "-c", script, folder, "ok"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    manifest = manifests.verify(folder)
    assert "model.safetensors" in manifest["files"]
    from safetensors.torch import load_file

    expected = torch.load(folder + ".expected", weights_only=True)
    assert all(
        torch.equal(load_file(os.path.join(folder, "model.safetensors"))[k], v) for k, v in expected.items()
    )

    failed_folder = str(tmp_path / "failed")
    failed = subprocess.run(
        [sys.executable, "-c", script, failed_folder, "fail"], env=env, capture_output=True, text=True
    )
    assert f"the checkpoint {failed_folder} could not be finished (OSError" in failed.stderr
    assert not os.path.exists(failed_folder) and not os.path.exists(manifests.incomplete_path(failed_folder))


def test_load_state_checks_sha256_on_request_and_rejects_unknown_verification(tmp_path):
    accelerator, model, optimizer = _setup(tmp_path)
    # By default a save records xxh3-128 only: asking for sha256 says how to get them, naming the file.
    location = accelerator.save_state(blocking=True)
    with pytest.raises(CheckpointError, match=r"records no sha256 for '.*'.*checkpoint_sha256=True"):
        accelerator.load_state(location, verify_manifest="sha256")
    accelerator.project_configuration.checkpoint_sha256 = True
    location = accelerator.save_state(blocking=True)
    accelerator.load_state(location, verify_manifest="sha256")
    path = os.path.join(location, "optimizer.bin")
    with open(path, "r+b") as handle:
        handle.seek(-2, os.SEEK_END)
        handle.write(b"\x00\x01")
    with pytest.raises(CheckpointError, match=r"optimizer\.bin does not match its sha256 checksum"):
        accelerator.load_state(location, verify_manifest="sha256")
    with pytest.raises(ValueError, match=r"verify_manifest='md5'.*'sha256'"):
        accelerator.load_state(location, verify_manifest="md5")


def test_save_state_is_complete_when_it_returns_by_default_like_accelerate(tmp_path):
    set_seed(0)
    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=project)
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    before = set(os.listdir(tmp_path))
    location = accelerator.save_state()
    # The folder is there under its final name, sealed, and nothing else new beside it but the hidden lock
    # that keeps a second run from saving into this project_dir.
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [rotation.LOCK_NAME, "checkpoint_0"]
    assert set(os.listdir(tmp_path)) - before == {"checkpoints"}
    manifests.verify(location)
    assert model.weight is not None
