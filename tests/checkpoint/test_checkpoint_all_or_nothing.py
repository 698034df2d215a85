"""Verify everything, then apply (issue 29, finding 2): every object a checkpoint restores is read and
checked before the first one changes. Each case here damages one file (and reseals the manifest, as
someone handing over a whole folder would) or changes what the loading script expects; the load must fail
with one CheckpointError naming the file and what did not match, and the model, optimizer, scheduler,
registered object, data loader position, random generators and step must be exactly as before."""

from __future__ import annotations

import os
import random

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.errors import CheckpointError
from drivetrain.testing import assert_checks_passed, launch_script
from drivetrain.utils import ProjectConfiguration, set_seed

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts")


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def _setup(project_dir):
    set_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(project_dir)))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=4, shuffle=True)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    return accelerator, model, optimizer, scheduler, loader, counter


def _train(accelerator, model, optimizer, scheduler, loader, steps):
    for _, (batch,) in zip(range(steps), loader):
        accelerator.backward(model(batch).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def _everything(accelerator, model, optimizer, scheduler, loader, counter):
    """What a load could change, in comparable form."""
    optimizer_state = optimizer.state_dict()
    return {
        "model": {name: tensor.clone() for name, tensor in model.state_dict().items()},
        "optimizer": {
            index: {key: value.clone() for key, value in state.items()}
            for index, state in optimizer_state["state"].items()
        },
        "lr": [group["lr"] for group in optimizer_state["param_groups"]],
        "scheduler": scheduler.state_dict(),
        "counter": counter.count,
        "loader": loader.resume_state()["batches_yielded"],
        "step": accelerator.step,
        "rng": (torch.get_rng_state().clone(), random.getstate()),
    }


def _same(before, after):
    assert before["model"].keys() == after["model"].keys()
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"]), "model changed"
    assert before["optimizer"].keys() == after["optimizer"].keys()
    for index, state in before["optimizer"].items():
        assert all(torch.equal(value, after["optimizer"][index][key]) for key, value in state.items())
    for key in ("lr", "scheduler", "counter", "loader", "step"):
        assert before[key] == after[key], key
    assert torch.equal(before["rng"][0], after["rng"][0]) and before["rng"][1] == after["rng"][1], "RNG"


def _reseal(folder, metadata=None):
    old = manifests.read_manifest(folder).get("metadata", {})
    os.remove(os.path.join(folder, manifests.MANIFEST_NAME))
    manifests.write_manifest(folder, old if metadata is None else metadata)


@pytest.fixture
def saved(tmp_path):
    """A checkpoint of a run two steps in, and a live run that has gone on since."""
    objects = _setup(tmp_path)
    accelerator, model, optimizer, scheduler, loader, counter = objects
    _train(accelerator, model, optimizer, scheduler, loader, steps=2)
    counter.count = 7
    accelerator.step = 2
    folder = accelerator.save_state(tmp_path / "ckpt")
    _train(accelerator, model, optimizer, scheduler, loader, steps=3)
    counter.count = 9
    accelerator.step = 5
    return folder, objects


# (file to replace, what to put there, what the error must say)
DAMAGED_FILES = {
    "scheduler_not_a_dict": (
        "scheduler.bin",
        [1, 2, 3],
        r"scheduler.bin holds a list, not the state of StepLR",
    ),
    "scheduler_of_another_kind": (
        "scheduler.bin",
        {"foo": 1},
        r"scheduler.bin is not the state of StepLR: it lacks base_lrs, gamma, last_epoch",
    ),
    "scheduler_wrong_types": (
        "scheduler.bin",
        "STEPLR_WITH_STRING_EPOCH",
        r"scheduler.bin is not the state of StepLR: 'last_epoch' holds a str",
    ),
    "registered_object": (
        "custom_checkpoint_0.pkl",
        {"total": 3},
        r"custom_checkpoint_0.pkl does not load into Counter: KeyError: 'count'",
    ),
    "registered_object_not_a_dict": (
        "custom_checkpoint_0.pkl",
        [3],
        r"custom_checkpoint_0.pkl holds a list, but Counter.state_dict\(\) gives a dict",
    ),
    "rng": (
        "random_states_0.pkl",
        {"python": "garbage", "torch": torch.zeros(3, dtype=torch.uint8)},
        r"random_states_0.pkl does not hold random generator states this process can restore",
    ),
    "rng_not_a_dict": ("random_states_0.pkl", [1], r"random_states_0.pkl holds a list, not random generator"),
    "loader": (
        "dl_state_dict.bin",
        {"epoch": "x", "batches_yielded": 1},
        r"dl_state_dict.bin: data loader state has epoch='x'",
    ),
    "loader_missing_position": (
        "dl_state_dict.bin",
        {"epoch": 0},
        r"dl_state_dict.bin: data loader state is missing batches_yielded",
    ),
    "optimizer_state_of_unknown_parameters": (
        "optimizer.bin",
        "OPTIMIZER_WITH_EXTRA_STATE",
        r"optimizer.bin holds state for parameters \[99\] that none of its parameter groups lists",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGED_FILES))
def test_a_file_of_the_wrong_structure_changes_nothing(saved, case):
    folder, objects = saved
    name, content, message = DAMAGED_FILES[case]
    path = os.path.join(folder, name)
    if content == "STEPLR_WITH_STRING_EPOCH":
        content = {**torch.load(path, weights_only=True), "last_epoch": "two"}
    elif content == "OPTIMIZER_WITH_EXTRA_STATE":
        content = torch.load(path, weights_only=True)
        content["state"][99] = {"step": torch.tensor(1.0)}
    torch.save(content, path)
    _reseal(folder)
    before = _everything(*objects)
    with pytest.raises(CheckpointError, match=message):
        objects[0].load_state(folder)
    _same(before, _everything(*objects))


def test_an_object_registered_now_that_the_checkpoint_lacks_changes_nothing(saved):
    folder, objects = saved
    objects[0].register_for_checkpointing(Counter())
    before = _everything(*objects)
    with pytest.raises(
        CheckpointError, match=r"custom_checkpoint_1.pkl not found: the checkpoint has no registered"
    ):
        objects[0].load_state(folder)
    _same(before, _everything(*objects))


@pytest.mark.parametrize("step", ["two", 1.5, -1, float("inf"), True, None])
def test_a_step_that_is_not_a_whole_number_changes_nothing(saved, step):
    folder, objects = saved
    metadata = manifests.read_manifest(folder)["metadata"]
    _reseal(folder, {**metadata, "step": step})
    before = _everything(*objects)
    with pytest.raises(CheckpointError, match=rf"has metadata.step={step!r}; a whole number >= 0 is needed"):
        objects[0].load_state(folder)
    _same(before, _everything(*objects))


def test_an_intact_checkpoint_still_restores_everything(saved):
    folder, objects = saved
    accelerator, model, optimizer, scheduler, loader, counter = objects
    accelerator.load_state(folder)
    assert counter.count == 7 and accelerator.step == 2 and scheduler.state_dict()["last_epoch"] == 2
    assert loader.resume_state()["batches_yielded"] == 0  # resumes at batch 2 on the next pass
    assert next(iter(loader)) is not None


@pytest.mark.multiprocess
def test_a_checkpoint_from_another_number_of_processes_changes_nothing(tmp_path):
    """Saved by two processes, loaded by one: the data loader's geometry does not match, which is found
    before anything is applied."""
    env = {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = launch_script(
        os.path.join(SCRIPTS, "ckpt_multiprocess.py"),
        num_processes=2,
        args=["loader", str(tmp_path / "two")],
        env=env,
    )
    assert_checks_passed(result, ["saved_with_two_processes"])
    objects = _setup(tmp_path / "one")
    before = _everything(*objects)
    with pytest.raises(
        CheckpointError,
        match=r"dl_state_dict.bin: data loader state was saved with total_batch_size=8 but this loader has "
        r"total_batch_size=4",
    ):
        objects[0].load_state(tmp_path / "two" / "ckpt")
    _same(before, _everything(*objects))


def test_a_chained_scheduler_is_checked_to_its_inner_states_without_copying_the_optimizer(monkeypatch):
    """SequentialLR keeps the schedulers it chains: their saved states are checked too, and the copy the
    state is tried on shares the optimizer (copying it would duplicate every parameter)."""
    import copy

    from drivetrain.checkpoint.state_checks import check_scheduler_state

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    chained = torch.optim.lr_scheduler.SequentialLR(
        optimizer,
        [torch.optim.lr_scheduler.LinearLR(optimizer), torch.optim.lr_scheduler.StepLR(optimizer, 1)],
        milestones=[2],
    )
    state = chained.state_dict()
    copied = []
    original_deepcopy = copy.deepcopy

    def recording_deepcopy(value, memo=None):
        result = original_deepcopy(value, memo)
        copied.append(result)
        return result

    monkeypatch.setattr(copy, "deepcopy", recording_deepcopy)
    check_scheduler_state(chained, state, "scheduler.bin")
    probe_state = next(item for item in copied if isinstance(item, dict) and "_schedulers" in item)
    assert all(inner.optimizer is optimizer for inner in probe_state["_schedulers"])
    monkeypatch.undo()
    state["_schedulers"] = [{"foo": 1}, {"foo": 2}]
    with pytest.raises(
        CheckpointError, match=r"not the state of SequentialLR\['_schedulers'\]\[0\]: it lacks"
    ):
        check_scheduler_state(chained, state, "scheduler.bin")
