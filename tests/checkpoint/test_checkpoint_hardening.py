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
from drivetrain.checkpoint import rotation
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
    assert sorted(os.listdir(root)) == [rotation.LOCK_NAME, "checkpoint_0", "checkpoint_2", "checkpoint_3"]
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


# -- nothing from a checkpoint runs code (finding 1, point 3) ------------------------------------------------
class _RunsCode:
    """Unpickling this creates ``marker``: proof that a reader ran code from a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _reseal(folder: str) -> None:
    """Rewrite the manifest after tampering, as an attacker who hands over a whole folder would."""
    metadata = manifests.read_manifest(folder).get("metadata", {})
    os.remove(os.path.join(folder, manifests.MANIFEST_NAME))
    manifests.write_manifest(folder, metadata)


@pytest.mark.parametrize(
    "victim",
    ["optimizer.bin", "pytorch_model.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"],
)
def test_load_state_runs_no_code_from_any_file(tmp_path, victim):
    accelerator, model, optimizer = _setup(tmp_path)
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1))

    class Counter:
        count = 3

        def state_dict(self):
            return {"count": self.count}

        def load_state_dict(self, state):
            self.count = state["count"]

    accelerator.register_for_checkpointing(Counter())
    folder = accelerator.save_state(tmp_path / "ckpt", safe_serialization=False)
    _step(accelerator, model, optimizer)  # the model now differs from the checkpoint
    marker = tmp_path / "code_ran"
    torch.save({"state": _RunsCode(str(marker))}, os.path.join(folder, victim))
    _reseal(folder)
    before = _weights(model)
    with pytest.raises(
        CheckpointError, match=rf"{victim} holds objects that safe loading refuses.*nothing in it"
    ):
        accelerator.load_state(folder)
    assert not marker.exists()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert scheduler.scheduler.last_epoch == 0


def test_big_model_loading_runs_no_code(tmp_path):
    from drivetrain.big_modeling import load_checkpoint_in_model

    marker = tmp_path / "code_ran"
    torch.save({"weight": _RunsCode(str(marker))}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin .* cannot be read"):
        load_checkpoint_in_model(torch.nn.Linear(2, 2), str(tmp_path / "pytorch_model.bin"))
    assert not marker.exists()


def test_dcp_reader_runs_no_code_from_metadata_or_values(tmp_path):
    """torch.distributed.checkpoint unpickles ``.metadata`` with plain pickle and non-tensor values with
    weights_only=False; the reader every backend uses refuses both, in one line, and runs nothing."""
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp

    from drivetrain.checkpoint.dcp_reading import read_dcp_metadata, safe_dcp_load

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    marker = tmp_path / "code_ran"
    folder = str(tmp_path / "dcp")
    dcp.save({"weight": torch.arange(4.0), "lr": 0.5}, checkpoint_id=folder, no_dist=True)
    state = {"weight": torch.zeros(4), "lr": 0.0}
    safe_dcp_load(state, folder, no_dist=True)  # a genuine folder loads
    assert torch.equal(state["weight"], torch.arange(4.0)) and state["lr"] == 0.5

    values = str(tmp_path / "values")
    dcp.save({"weight": torch.arange(4.0), "lr": _RunsCode(str(marker))}, checkpoint_id=values, no_dist=True)
    with pytest.raises(CheckpointError, match="value 'lr' of a DCP checkpoint was refused"):
        safe_dcp_load({"weight": torch.zeros(4), "lr": 0.0}, values, no_dist=True)
    assert not marker.exists()

    with open(os.path.join(folder, ".metadata"), "wb") as out:
        pickle.dump(_RunsCode(str(marker)), out)
    with pytest.raises(CheckpointError, match=r"\.metadata was refused \(it names posix.system"):
        read_dcp_metadata(folder)
    with pytest.raises(CheckpointError, match=r"\.metadata was refused"):
        safe_dcp_load({"weight": torch.zeros(4)}, folder, no_dist=True)
    with open(os.path.join(folder, ".metadata"), "wb") as out:
        out.write(b"\x80\x04garbage")
    with pytest.raises(CheckpointError, match=r"\.metadata is unreadable"):
        read_dcp_metadata(folder)
    assert not marker.exists()


# -- symbolic links and manifest bounds (findings 5, 6) ------------------------------------------------------
def _saved(tmp_path):
    accelerator, model, optimizer = _setup(tmp_path)
    return accelerator, model, accelerator.save_state(tmp_path / "ckpt")


def test_load_state_follows_no_symbolic_link(tmp_path):
    """A checkpoint whose optimizer file is a link to a file outside (here /proc/self/environ), with a
    manifest made to match it, is refused before anything is read."""
    accelerator, model, folder = _saved(tmp_path)
    target = os.path.join(folder, "optimizer.bin")
    os.remove(target)
    os.symlink("/proc/self/environ", target)
    manifest = manifests.read_manifest(folder)
    manifest["files"]["optimizer.bin"] = {"size": os.path.getsize(target), "sha256_chunks": ["0" * 64]}
    with open(os.path.join(folder, manifests.MANIFEST_NAME), "w") as out:
        json.dump(manifest, out)
    with pytest.raises(CheckpointError, match=r"holds symbolic links \(optimizer.bin\)"):
        accelerator.load_state(folder)
    # A file listed inside a linked folder is refused the same way.
    os.remove(target)
    os.symlink("/etc", os.path.join(folder, "extra"))
    manifest["files"]["extra/hostname"] = {"size": os.path.getsize("/etc/hostname")}
    with open(os.path.join(folder, manifests.MANIFEST_NAME), "w") as out:
        json.dump(manifest, out)
    with pytest.raises(CheckpointError, match=r"symbolic links \(extra\)"):
        manifests.verify(folder)


def test_a_link_beside_the_checkpoint_is_not_part_of_it(tmp_path):
    """The folder may be the user's, with the user's own links in it: a link the manifest does not list is
    no part of the checkpoint, never read, and does not stop the load."""
    accelerator, model, folder = _saved(tmp_path)
    os.symlink("/etc", os.path.join(folder, "extra"))
    os.symlink("/proc/self/environ", os.path.join(folder, "model_1.safetensors"))
    assert "extra" not in manifests.verify(folder)["files"]
    accelerator.load_state(folder)


def test_save_refuses_to_seal_a_folder_with_a_link(tmp_path):
    accelerator, model, optimizer = _setup(tmp_path)
    accelerator.register_save_state_pre_hook(
        lambda models, weights, output_dir: os.symlink("/etc/hostname", os.path.join(output_dir, "host"))
    )
    with pytest.raises(CheckpointError, match="holds symbolic links \\(host\\)"):
        accelerator.save_state(tmp_path / "ckpt")
    assert not os.path.exists(tmp_path / "ckpt") and not os.path.exists(tmp_path / ".ckpt.incomplete")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("chunk_size", 1, "invalid chunk_size 1 \\(valid: a whole number of bytes from 256"),
        ("chunk_size", True, "invalid chunk_size True"),
        ("chunk_size", 2**62, "invalid chunk_size"),
        ("version", "2", "invalid version '2'"),
        ("size", -1, "no valid size for 'optimizer.bin': -1"),
        ("size", 2**62, "has \\d+ bytes but the manifest records"),
        ("pieces", ["0" * 32] * 100_000, "records 100000 xxh3_128 pieces for 'optimizer.bin'"),
        ("pieces", "abc", "records str xxh3_128 pieces"),
        ("name", "/etc/passwd", "lists a file outside the folder: '/etc/passwd'"),
        ("name", "a/../../x", "outside the folder"),
    ],
)
def test_tampered_manifest_fields_are_refused_quickly(tmp_path, field, value, message):
    accelerator, model, folder = _saved(tmp_path)
    path = os.path.join(folder, manifests.MANIFEST_NAME)
    with open(path) as handle:
        manifest = json.load(handle)
    entry = manifest["files"]["optimizer.bin"]
    if field in ("chunk_size", "version"):
        manifest[field] = value
    elif field == "size":
        entry["size"] = value
    elif field == "pieces":
        entry["xxh3_128_chunks"] = value
    else:
        manifest["files"][value] = entry
    with open(path, "w") as out:
        json.dump(manifest, out)
    before = _weights(model)
    with pytest.raises(CheckpointError, match=message):
        accelerator.load_state(folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_huge_manifest_is_refused_unread(tmp_path):
    accelerator, model, folder = _saved(tmp_path)
    with open(os.path.join(folder, manifests.MANIFEST_NAME), "ab") as out:
        out.truncate(manifests.MAX_MANIFEST_BYTES + 10)
    with pytest.raises(CheckpointError, match="larger than 16777216 bytes"):
        accelerator.load_state(folder)


# -- loading is all-or-nothing (finding 7, point 4) ---------------------------------------------------------
@pytest.mark.parametrize("safe_serialization", [True, False])
def test_failed_load_leaves_the_model_untouched(tmp_path, safe_serialization):
    """The checkpoint's optimizer has one parameter group, this run's two: the load fails in one line
    naming both layouts, and the model, optimizer and step are exactly as before."""
    saver, saved_model, saved_optimizer = _setup(tmp_path / "a")
    _step(saver, saved_model, saved_optimizer)
    folder = saver.save_state(tmp_path / "ckpt", safe_serialization=safe_serialization)

    accelerator, model, optimizer = _setup(tmp_path / "b", optimizer_groups=2)
    _step(accelerator, model, optimizer)
    before, optimizer_before = _weights(model), optimizer.state_dict()
    with pytest.raises(
        CheckpointError,
        match=r"optimizer.bin holds 1 parameter group\(s\) of \[4\] parameters but AdamW has 2 of \[2, 2\]",
    ):
        accelerator.load_state(folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    after = optimizer.state_dict()
    assert len(after["param_groups"]) == 2 and after["param_groups"][1]["lr"] == 0.01
    assert all(
        torch.equal(optimizer_before["state"][0][key], after["state"][0][key]) for key in ("exp_avg", "step")
    )


def test_model_that_does_not_fit_is_refused_before_anything_changes(tmp_path):
    saver, saved_model, _ = _setup(tmp_path / "a")
    folder = saver.save_state(tmp_path / "ckpt")
    set_seed(1)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path / "b")))
    first, second = torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    first, second = accelerator.prepare(first, second)
    before = _weights(first)
    # model_1.safetensors does not exist: the second model's weights are missing; the first is not applied.
    with pytest.raises(CheckpointError, match="weights for model 1"):
        accelerator.load_state(folder)
    assert all(torch.equal(before[k], v) for k, v in first.state_dict().items())


# -- a failed save leaves no debris and says what happened (finding 3) ---------------------------------------
def test_save_that_runs_out_of_space_leaves_no_debris_and_says_what_was_kept(tmp_path):
    """A real write failure (the file size limit of the process, as a full disk would): one line naming
    the folder, the OS error and what was kept; no temporary left; the previous checkpoint still loads."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import resource, signal, sys, torch
        from drivetrain import Accelerator
        from drivetrain.errors import CheckpointError
        accelerator = Accelerator()
        model = accelerator.prepare(torch.nn.Linear(256, 256))
        accelerator.save_state(sys.argv[1] + "/first")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        try:
            accelerator.save_state(sys.argv[1] + "/second")
        except CheckpointError as exc:
            print("ERROR", exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("ERROR"))
    assert f"save_state into {tmp_path}/second failed: OSError: [Errno 27] File too large" in line
    assert line.endswith(f"{tmp_path}/second was not written and earlier checkpoints are untouched")
    assert sorted(os.listdir(tmp_path)) == ["first"]
    manifests.verify(str(tmp_path / "first"))


def test_checkpoint_pruned_by_another_run_during_a_load_is_a_clear_error(tmp_path):
    """Another run prunes the checkpoint between the moment this load picked it and the moment it reads
    (here: a pre-hook deletes the folder, as the other run's prune would): one CheckpointError, not a raw
    FileNotFoundError, and nothing applied."""
    accelerator, model, optimizer = _setup(tmp_path, automatic_checkpoint_naming=True)
    folder = accelerator.save_state()
    _step(accelerator, model, optimizer)
    accelerator.register_load_state_pre_hook(lambda models, input_dir: shutil.rmtree(input_dir))
    before = _weights(model)
    with pytest.raises(
        CheckpointError, match="checkpoint_0.*(removed or replaced during the load|disappeared)"
    ):
        accelerator.load_state()
    assert not os.path.exists(folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class _WithCounts(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.register_buffer("counts", torch.zeros(3, dtype=dtype))


@pytest.mark.parametrize("safe_serialization", [True, False], ids=["safetensors", "bin"])
def test_a_checkpoint_with_int32_state_loads_into_float32_state_by_casting(tmp_path, safe_serialization):
    # Finding 8 said an int32 -> fp32 mismatch gave an unclear error; torch's load_state_dict casts, and so
    # does load_state: the values arrive, in the model's dtype.
    from drivetrain import reset_state

    accelerator = Accelerator(project_dir=str(tmp_path))
    saved = accelerator.prepare(_WithCounts(torch.int32))
    saved.counts.copy_(torch.tensor([1, 2, 3], dtype=torch.int32))
    location = accelerator.save_state(str(tmp_path / "ckpt"), safe_serialization=safe_serialization)
    reset_state()
    accelerator = Accelerator(project_dir=str(tmp_path))
    loaded = accelerator.prepare(_WithCounts(torch.float32))
    accelerator.load_state(location)
    assert loaded.counts.dtype == torch.float32 and loaded.counts.tolist() == [1.0, 2.0, 3.0]
    assert torch.equal(loaded.linear.weight, saved.linear.weight)
