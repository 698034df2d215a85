"""Accelerator checkpoint methods in one process: what save_state writes, what load_state restores, hooks,
registration, automatic naming, pruning, save_model and save."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint import rotation
from drivetrain.checkpoint.files import sha256_of_file
from drivetrain.constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, SCALER_NAME, WEIGHTS_NAME
from drivetrain.errors import CheckpointError, CheckpointWarning
from drivetrain.utils import ProjectConfiguration, set_seed


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(torch.relu(self.mid(self.embed(x))))


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def _setup(tmp_path, **config):
    set_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path), **config))
    model = Tied()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def _train(accelerator, model, optimizer, scheduler, steps=2):
    for _ in range(steps):
        accelerator.backward(model(torch.randint(0, 10, (4,))).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def _snapshot(model, optimizer, scheduler):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {k: {n: t.clone() for n, t in s.items()} for k, s in optimizer.state_dict()["state"].items()},
        scheduler.state_dict()["last_epoch"],
    )


def test_save_and_load_state_round_trip(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    _train(accelerator, model, optimizer, scheduler)
    counter.count = 5
    before = _snapshot(model, optimizer, scheduler)
    torch.manual_seed(123)
    location = accelerator.save_state(tmp_path / "ckpt")
    after_rng = torch.rand(3)  # what the RNG yields right after the save
    accelerator.wait_for_checkpoint()  # the folder appears once the save finished in the background
    assert sorted(os.listdir(location)) == sorted(
        [
            manifests.MANIFEST_NAME,
            SAFE_WEIGHTS_NAME,
            "optimizer.bin",
            "scheduler.bin",
            "random_states_0.pkl",
            "custom_checkpoint_0.pkl",
        ]
    )
    assert set(load_file(os.path.join(location, SAFE_WEIGHTS_NAME))) == {
        "embed.weight",
        "mid.weight",
        "mid.bias",
    }

    _train(accelerator, model, optimizer, scheduler, steps=3)
    counter.count = 9
    torch.manual_seed(999)
    assert accelerator.load_state(tmp_path / "ckpt") == location
    assert torch.equal(torch.rand(3), after_rng), "RNG state not restored"
    weights, optimizer_state, last_epoch = _snapshot(model, optimizer, scheduler)
    assert all(torch.equal(weights[k], before[0][k]) for k in weights)
    assert all(torch.equal(optimizer_state[p][n], before[1][p][n]) for p in before[1] for n in before[1][p])
    assert last_epoch == before[2] and counter.count == 5
    unwrapped = accelerator.unwrap_model(model)
    assert unwrapped.head.weight is unwrapped.embed.weight


def test_bin_serialization_and_scaler_file(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    location = accelerator.save_state(tmp_path / "ckpt", safe_serialization=False, blocking=True)
    assert {"pytorch_model.bin", SCALER_NAME} <= set(os.listdir(location))
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    accelerator.load_state(location)
    assert accelerator.scaler.get_scale() == 64.0


def test_automatic_naming_total_limit_and_latest(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(
        tmp_path, automatic_checkpoint_naming=True, total_limit=2
    )
    saved = []
    for _ in range(4):
        _train(accelerator, model, optimizer, scheduler, steps=1)
        saved.append(accelerator.save_state())
    accelerator.wait_for_everyone()  # also completes the last save
    root = tmp_path / "checkpoints"
    assert [os.path.basename(p) for p in saved] == [f"checkpoint_{n}" for n in range(4)]
    assert sorted(os.listdir(root)) == [rotation.LOCK_NAME, "checkpoint_2", "checkpoint_3"]
    assert accelerator.save_iteration == 4
    expected = load_file(os.path.join(saved[-1], SAFE_WEIGHTS_NAME))

    # The newest folder is damaged (manifest gone): load_state() falls back to the newest complete one,
    # and says which it skipped and why.
    os.remove(root / "checkpoint_3" / manifests.MANIFEST_NAME)
    _train(accelerator, model, optimizer, scheduler, steps=1)
    with pytest.warns(CheckpointWarning, match=r"skipped checkpoint_3 \(.*has no drivetrain_manifest.json"):
        assert os.path.basename(accelerator.load_state()) == "checkpoint_2"
    assert accelerator.save_iteration == 3
    with pytest.raises(CheckpointError, match="already exists"):
        accelerator.save_state()  # checkpoint_3 (the damaged one) is in the way and is not overwritten
    assert expected  # the damaged folder was left alone, not deleted


def test_load_state_errors_are_clear(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    with pytest.raises(ValueError, match="needs input_dir"):
        accelerator.load_state()
    with pytest.raises(ValueError, match="needs output_dir"):
        accelerator.save_state()
    with pytest.raises(CheckpointError, match="does not exist"):
        accelerator.load_state(tmp_path / "nowhere")
    location = accelerator.save_state(tmp_path / "ckpt", blocking=True)
    with open(os.path.join(location, "optimizer.bin"), "ab") as handle:
        handle.write(b"x")
    with pytest.raises(CheckpointError, match=r"optimizer\.bin has \d+ bytes"):
        accelerator.load_state(location)
    automatic, *_ = _setup(tmp_path / "empty", automatic_checkpoint_naming=True)
    with pytest.raises(CheckpointError, match="no complete checkpoint under"):
        automatic.load_state()


def test_malicious_registered_object_runs_nothing_unless_opted_out(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    class Holder:
        value = None

        def state_dict(self):
            return {"payload": Evil()}

        def load_state_dict(self, state):
            self.value = state

    holder = Holder()
    accelerator.register_for_checkpointing(holder)
    location = accelerator.save_state(tmp_path / "ckpt")
    with pytest.raises(
        CheckpointError, match=r"custom_checkpoint_0\.pkl holds objects that safe loading refuses"
    ):
        accelerator.load_state(location)
    assert not marker.exists()
    accelerator.load_state(location, load_kwargs={"weights_only": False})  # the documented opt-out
    assert marker.exists()


def test_register_for_checkpointing_rejects_objects_without_state_dict(tmp_path):
    accelerator, *_ = _setup(tmp_path)
    with pytest.raises(ValueError, match=r"Item at index 1 \(object\)"):
        accelerator.register_for_checkpointing(Counter(), object())
    assert accelerator._custom_objects == []


def test_pre_hooks_run_can_drop_a_model_and_are_removable(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    calls = []

    def save_hook(models, weights, output_dir):
        calls.append(("save", len(models)))
        with open(os.path.join(output_dir, "config.json"), "w") as handle:
            json.dump({"hidden": 8}, handle)
        weights.pop(0)  # this model is saved by the hook's own means

    def load_hook(models, input_dir):
        calls.append(("load", len(models), input_dir))
        models.pop(0)

    save_handle = accelerator.register_save_state_pre_hook(save_hook)
    load_handle = accelerator.register_load_state_pre_hook(load_hook)
    location = accelerator.save_state(tmp_path / "ckpt")
    accelerator.wait_for_checkpoint()
    assert SAFE_WEIGHTS_NAME not in os.listdir(location)
    assert "config.json" in manifests.verify(location)["files"]  # the hook's file is part of the checkpoint
    accelerator.load_state(location)  # no model file, but the hook took the model off the list
    assert calls == [("save", 1), ("load", 1, location)]

    save_handle.remove()
    load_handle.remove()
    accelerator.load_state(accelerator.save_state(tmp_path / "ckpt2"))
    assert len(calls) == 2


def test_save_model_sharded(tmp_path):
    accelerator, model, *_ = _setup(tmp_path)
    accelerator.save_model(model, tmp_path / "export", max_shard_size="300B")
    files = sorted(os.listdir(tmp_path / "export"))
    assert SAFE_WEIGHTS_INDEX_NAME in files and len(files) >= 3
    with open(tmp_path / "export" / SAFE_WEIGHTS_INDEX_NAME) as handle:
        weight_map = json.load(handle)["weight_map"]
    merged = {}
    for shard in set(weight_map.values()):
        merged.update(load_file(tmp_path / "export" / shard))
    reference = accelerator.unwrap_model(model).state_dict()
    assert all(torch.equal(merged[k], reference[k]) for k in merged)
    assert set(merged) == set(reference) - {"head.weight"}
    accelerator.save_model(model, tmp_path / "bin", safe_serialization=False)
    assert os.listdir(tmp_path / "bin") == [WEIGHTS_NAME]
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        accelerator.save_model(model, tmp_path / "a_file")


def test_get_state_dict_and_save(tmp_path):
    accelerator, model, *_ = _setup(tmp_path)
    state = accelerator.get_state_dict(model)
    assert "embed.weight" in state and not any(k.startswith("module.") for k in state)
    accelerator.save({"step": 3, "w": torch.ones(2)}, tmp_path / "obj.pt")
    assert torch.load(tmp_path / "obj.pt", weights_only=True)["step"] == 3
    accelerator.save({"w": torch.ones(2)}, tmp_path / "obj.safetensors", safe_serialization=True)
    assert torch.equal(load_file(tmp_path / "obj.safetensors")["w"], torch.ones(2))
    assert sorted(os.listdir(tmp_path)) == ["obj.pt", "obj.safetensors"]


@pytest.mark.parametrize("damaged", [SAFE_WEIGHTS_NAME, "optimizer.bin", "custom_checkpoint_0.pkl"])
def test_a_tampered_file_fails_the_load_and_nothing_is_applied(tmp_path, damaged):
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    _train(accelerator, model, optimizer, scheduler)
    location = accelerator.save_state(tmp_path / "ckpt")
    accelerator.wait_for_checkpoint()
    path = os.path.join(location, damaged)
    with open(path, "r+b") as handle:  # same size, one byte of the data changed
        handle.seek(-3, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-3, os.SEEK_END)
        handle.write(bytes([byte[0] ^ 0xFF]))

    _train(accelerator, model, optimizer, scheduler, steps=3)
    counter.count = 9
    current = _snapshot(model, optimizer, scheduler)
    torch.manual_seed(7)
    with pytest.raises(
        CheckpointError, match=rf"{damaged.replace('.', '[.]')} does not match its xxh3_128 checksum"
    ):
        accelerator.load_state(location)
    drawn = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(drawn, torch.rand(3)), "the RNG state was restored from a checkpoint that failed"
    weights, optimizer_state, last_epoch = _snapshot(model, optimizer, scheduler)
    assert all(torch.equal(weights[k], current[0][k]) for k in weights)
    assert all(
        torch.equal(optimizer_state[p][n], current[1][p][n]) for p in current[1] for n in current[1][p]
    )
    assert last_epoch == current[2] and counter.count == 9


def test_checkpoint_with_a_version_1_manifest_still_loads(tmp_path):
    # Written before manifest version 2: one whole-file sha256 per file, no chunk_size.
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    _train(accelerator, model, optimizer, scheduler)
    before = _snapshot(model, optimizer, scheduler)
    location = accelerator.save_state(tmp_path / "ckpt", blocking=True)
    path = os.path.join(location, manifests.MANIFEST_NAME)
    with open(path) as handle:
        manifest = json.load(handle)
    manifest["version"] = 1
    del manifest["chunk_size"]
    for name in list(manifest["files"]):
        size, digest = sha256_of_file(os.path.join(location, name))
        manifest["files"][name] = {"size": size, "sha256": digest}
    with open(path, "w") as handle:
        json.dump(manifest, handle)

    _train(accelerator, model, optimizer, scheduler, steps=2)
    assert accelerator.load_state(location) == location
    weights, optimizer_state, last_epoch = _snapshot(model, optimizer, scheduler)
    assert all(torch.equal(weights[k], before[0][k]) for k in weights)
    assert all(torch.equal(optimizer_state[p][n], before[1][p][n]) for p in before[1] for n in before[1][p])
    assert last_epoch == before[2]


@pytest.mark.parametrize("optimizer_has_state", [True, False])
def test_loaded_optimizer_state_is_the_optimizers_own_memory_not_the_files(tmp_path, optimizer_has_state):
    # load_state maps the optimizer file instead of reading it; what the optimizer ends up holding must
    # still be independent of the file (changing or deleting it afterwards changes nothing).
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    _train(accelerator, model, optimizer, scheduler)
    location = accelerator.save_state(tmp_path / "ckpt", blocking=True)
    saved = _snapshot(model, optimizer, scheduler)[1]
    if optimizer_has_state:
        _train(accelerator, model, optimizer, scheduler)
        own = {id(t) for entries in optimizer.optimizer.state.values() for t in entries.values()}
    else:
        accelerator, model, optimizer, scheduler = _setup(tmp_path)
        assert not optimizer.state_dict()["state"]
    accelerator.load_state(location)
    loaded = optimizer.optimizer.state
    if optimizer_has_state:  # copied into the tensors it had: no new memory
        assert {id(t) for entries in loaded.values() for t in entries.values()} == own
    path = os.path.join(location, "optimizer.bin")
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:  # overwrite the file in place, then remove it
        handle.write(b"\xff" * size)
    os.remove(path)
    state = optimizer.state_dict()["state"]
    assert all(torch.equal(state[p][n], saved[p][n]) for p in saved for n in saved[p])


def test_stateful_loader_checkpoint_keeps_the_resume_record_and_takes_accelerates(tmp_path):
    from torch.utils.data import DataLoader, TensorDataset

    from drivetrain.checkpoint.training_objects import safe_load, torch_save_into_checkpoint
    from drivetrain.state import reset_state
    from drivetrain.utils import DataLoaderConfiguration

    def prepared():
        reset_state()
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        data = DataLoader(TensorDataset(torch.arange(40)), batch_size=4, shuffle=True)
        return accelerator, accelerator.prepare(data)

    set_seed(1)
    accelerator, loader = prepared()
    reference = []
    for step, (batch,) in enumerate(loader):
        reference.append(batch.tolist())
        if step == 3:
            accelerator.save_state(str(tmp_path / "ckpt"))
            torchdata_state = loader.state_dict()  # what Accelerate's save_state writes
    record = safe_load(str(tmp_path / "ckpt" / "dl_state_dict.bin"), map_location="cpu")
    assert record["epoch"] == 0 and record["batches_yielded"] == 4 and record["loader"]
    assert "epoch" not in torchdata_state and torchdata_state["_num_yielded"] == 4

    set_seed(2)  # a new run: another seed, the saved record decides the order
    accelerator, loader = prepared()
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert [batch.tolist() for (batch,) in loader] == reference[4:]

    folder = tmp_path / "from-accelerate"
    folder.mkdir()
    torch_save_into_checkpoint(torchdata_state, str(folder / "dl_state_dict.bin"))
    set_seed(1)  # torchdata's dict holds the position only: the shuffle comes from the seed, as in Accelerate
    accelerator, loader = prepared()
    loader.load_state_dict(safe_load(str(folder / "dl_state_dict.bin"), map_location="cpu"))
    assert [batch.tolist() for (batch,) in loader] == reference[4:]
