"""Checkpoints under several processes (DDP, gloo); launched by tests/checkpoint/test_checkpoint_multiprocess.py.

    python ckpt_multiprocess.py crash  PROJECT        save checkpoint_0, train, start checkpoint_1 and get
                                                      SIGKILLed where CKPT_KILL_AT says, on the rank(s) in
                                                      CKPT_KILL_RANK ("0", "1" or "all")
    python ckpt_multiprocess.py resume PROJECT N      load_state() must pick checkpoint_N and restore it;
                                                      then save again
    python ckpt_multiprocess.py fail   PROJECT WHO    a save where rank WHO raises ("object": rank 0's
                                                      registered object; "hook": rank 1's pre-hook), then a
                                                      load of a tampered checkpoint
    python ckpt_multiprocess.py finish PROJECT        rank 0's background finishing of a save fails (disk
                                                      full): every rank raises at wait_for_everyone, then
                                                      saves again
    python ckpt_multiprocess.py nodes  BASE EACH      two machines: save with save_on_each_node=EACH (each
                                                      machine's own BASE/node<k> when EACH is 1), load back
    python ckpt_multiprocess.py loader PROJECT        save PROJECT/ckpt (a folder holding the user's file)
                                                      twice with a prepared data loader, for a load under
                                                      another number of processes

Prints ``CHECK <name> ok`` for each check that passed (see drivetrain.testing.assert_checks_passed); the main
process writes PROJECT/expected_<n>.pt with the weights checkpoint_<n> holds.
"""

from __future__ import annotations

import os
import sys

import torch

# The script's folder is on sys.path: reuse the single-process crash test's kill switch.
from ckpt_crash import install_kill_switch

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint import rotation
from drivetrain.errors import CheckpointError
from drivetrain.utils import ProjectConfiguration, set_seed


class Failing:
    """A registered object whose state_dict raises on the chosen rank."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def state_dict(self) -> dict:
        if self.fail:
            raise ValueError("state_dict exploded on purpose")
        return {"fine": 1}

    def load_state_dict(self, state: dict) -> None:
        pass


def setup(project_dir: str, total_limit: int | None = 1, save_on_each_node: bool = False):
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    config = ProjectConfiguration(
        project_dir=project_dir,
        automatic_checkpoint_naming=True,
        total_limit=total_limit,
        save_on_each_node=save_on_each_node,
    )
    accelerator = Accelerator(project_config=config)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def train_step(accelerator, model, optimizer) -> None:
    generator = torch.Generator().manual_seed(10 + accelerator.process_index)  # different data per rank
    loss = model(torch.randn(8, 16, generator=generator)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def weights(accelerator, model) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in accelerator.get_state_dict(model).items()}


def same(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> bool:
    return left.keys() == right.keys() and all(torch.equal(left[name], right[name]) for name in left)


def check(accelerator, name: str, passed: bool) -> None:
    """Every rank must pass; rank 0 prints the verdict."""
    verdicts = accelerator.state.collectives.all_gather_object(bool(passed))
    if accelerator.is_main_process:
        print(f"CHECK {name} {'ok' if all(verdicts) else f'failed {verdicts}'}", flush=True)


def crash(project_dir: str) -> None:
    accelerator, model, optimizer = setup(project_dir)
    kill_rank = os.environ["CKPT_KILL_RANK"]
    for iteration in range(2):
        train_step(accelerator, model, optimizer)
        if accelerator.is_main_process:
            torch.save(weights(accelerator, model), os.path.join(project_dir, f"expected_{iteration}.pt"))
        accelerator.wait_for_everyone()
        if iteration == 1 and kill_rank in ("all", str(accelerator.process_index)):
            install_kill_switch(os.environ["CKPT_KILL_AT"])
        accelerator.save_state()
    accelerator.wait_for_everyone()  # the save finishes in the background: this is where it is complete
    print("second save finished without being killed", flush=True)


def resume(project_dir: str, survivor: int) -> None:
    accelerator, model, optimizer = setup(project_dir)
    before = weights(accelerator, model)
    loaded = accelerator.load_state()
    expected = torch.load(os.path.join(project_dir, f"expected_{survivor}.pt"), weights_only=True)
    check(accelerator, "picked_previous", os.path.basename(loaded) == f"checkpoint_{survivor}")
    check(accelerator, "weights_restored", same(weights(accelerator, model), expected))
    check(accelerator, "weights_changed", not same(before, expected))
    check(accelerator, "optimizer_restored", bool(optimizer.state_dict()["state"]))
    train_step(accelerator, model, optimizer)
    saved = accelerator.save_state()
    accelerator.wait_for_everyone()
    root = os.path.dirname(saved)
    check(accelerator, "next_number", os.path.basename(saved) == f"checkpoint_{survivor + 1}")
    check(
        accelerator,
        "leftovers_cleared",
        sorted(os.listdir(root)) == [rotation.LOCK_NAME, f"checkpoint_{survivor + 1}"],
    )


def fail(project_dir: str, who: str) -> None:
    accelerator, model, optimizer = setup(project_dir, total_limit=None)
    rank = accelerator.process_index
    failing = Failing(fail=False)
    accelerator.register_for_checkpointing(failing)
    train_step(accelerator, model, optimizer)
    first = accelerator.save_state()
    saved = weights(accelerator, model)
    if who == "hook":

        def explode(models, state_dicts, output_dir):
            if rank == 1:
                raise RuntimeError("pre-hook exploded on purpose")

        accelerator.register_save_state_pre_hook(explode)
    else:
        failing.fail = rank == 0
    failing_rank = "0" if who == "object" else "1"
    try:
        accelerator.save_state()
    except CheckpointError as exc:
        message = str(exc)
        print(f"rank {rank} raised: {message}", flush=True)
        raised = f"failed on rank {failing_rank}: " in message and "exploded on purpose" in message
    else:
        raised = False
    check(accelerator, "every_rank_raised_naming_the_failed_rank", raised)
    root = os.path.dirname(first)
    latest = rotation.complete_checkpoints(root)
    check(accelerator, "previous_is_latest", [os.path.basename(p) for p in latest] == ["checkpoint_0"])
    check(accelerator, "no_leftover_folder", sorted(os.listdir(root)) == [rotation.LOCK_NAME, "checkpoint_0"])

    # Loading a checkpoint with a tampered file (same size): every rank refuses, nothing is applied.
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        path = os.path.join(first, "model.safetensors")
        with open(path, "r+b") as handle:
            handle.seek(-4, os.SEEK_END)
            last = handle.read(4)
            handle.seek(-4, os.SEEK_END)
            handle.write(bytes(255 - b for b in last))
    accelerator.wait_for_everyone()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    disturbed = weights(accelerator, model)
    optimizer_before = {k: v["exp_avg"].clone() for k, v in optimizer.state_dict()["state"].items()}
    try:
        accelerator.load_state(first)
    except CheckpointError as exc:
        refused = "model.safetensors does not match its xxh3_128 checksum" in str(exc)
    else:
        refused = False
    check(accelerator, "tampered_load_refused_everywhere", refused)
    check(accelerator, "nothing_applied", same(weights(accelerator, model), disturbed))
    optimizer_after = {k: v["exp_avg"] for k, v in optimizer.state_dict()["state"].items()}
    check(accelerator, "optimizer_untouched", same(optimizer_after, optimizer_before))
    check(accelerator, "saved_weights_differ", not same(saved, disturbed))


def finish_failure(project_dir: str) -> None:
    from drivetrain.checkpoint import files

    accelerator, model, optimizer = setup(project_dir, total_limit=None)
    rank = accelerator.process_index
    train_step(accelerator, model, optimizer)
    first = accelerator.save_state(blocking=True)

    def disk_full(stage: str, path: str) -> None:
        if stage == "files_synced":
            raise OSError(28, "No space left on device")

    files.on_stage = disk_full  # only rank 0 finishes saves; set everywhere to show that is so
    train_step(accelerator, model, optimizer)
    # A background save (opt-in): returns on both ranks; the failure comes later, on rank 0's thread.
    second = accelerator.save_state(blocking=False)
    try:
        accelerator.wait_for_everyone()
    except CheckpointError as exc:
        message = str(exc)
        print(f"rank {rank} raised: {message}", flush=True)
        raised = "failed on rank 0: OSError" in message and "No space left" in message and second in message
    else:
        raised = False
    check(accelerator, "every_rank_raised_at_the_next_wait", raised)
    files.on_stage = lambda stage, path: None
    root = os.path.dirname(first)
    check(accelerator, "previous_is_latest", rotation.complete_checkpoints(root) == [first])
    check(accelerator, "no_leftover_folder", sorted(os.listdir(root)) == [rotation.LOCK_NAME, "checkpoint_0"])
    third = accelerator.save_state()
    accelerator.wait_for_everyone()
    check(accelerator, "next_save_completes", rotation.complete_checkpoints(root) == [first, third])
    check(accelerator, "next_save_takes_the_failed_number", third == second)


def nodes(base: str, each: bool) -> None:
    node = int(os.environ.get("GROUP_RANK", "0"))
    # Both "machines" share this disk: with save_on_each_node each gets its own folder, as if local.
    project_dir = os.path.join(base, f"node{node}" if each else "shared")
    accelerator, model, optimizer = setup(project_dir, total_limit=None, save_on_each_node=each)
    train_step(accelerator, model, optimizer)
    saved = weights(accelerator, model)
    location = accelerator.save_state()
    accelerator.wait_for_everyone()
    local_ranks = accelerator.state.collectives.all_gather_object((node, accelerator.process_index))
    mine = sorted(rank for machine, rank in local_ranks if machine == node or not each)
    if accelerator.is_local_main_process and (each or accelerator.is_main_process):
        listed = manifests.verify(location)["files"]
        rng_files = sorted(name for name in listed if name.startswith("random_states_"))
        check_local = (
            rng_files == [f"random_states_{rank}.pkl" for rank in mine] and "model.safetensors" in listed
        )
    else:
        check_local = True
    check(accelerator, "manifest_lists_local_rng_states", check_local)

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    loaded = accelerator.load_state()
    check(accelerator, "loaded_own_machines_copy", os.path.dirname(os.path.dirname(loaded)) == project_dir)
    check(accelerator, "weights_restored", same(weights(accelerator, model), saved))
    everyone = accelerator.state.collectives.all_gather_object(weights(accelerator, model))
    check(accelerator, "equal_on_every_rank", all(same(everyone[0], other) for other in everyone))


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


def loader_checkpoint(project_dir: str) -> None:
    """The objects of tests/checkpoint/test_checkpoint_all_or_nothing.py, two steps in, saved under this many
    processes (each loader's share of a batch is 4 samples)."""
    from torch.utils.data import DataLoader, TensorDataset

    set_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=project_dir))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=4, shuffle=True)
    accelerator.register_for_checkpointing(Counter())
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    for _, (batch,) in zip(range(2), loader):
        accelerator.backward(model(batch).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    folder = os.path.join(project_dir, "ckpt")
    if accelerator.is_main_process:  # a folder holding the user's file: every rank saves into it in place
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "notes.txt"), "w") as out:
            out.write("mine")
    accelerator.wait_for_everyone()
    accelerator.save_state(folder)
    location = accelerator.save_state(folder)  # and over the checkpoint it holds
    listed = manifests.verify(location)["files"]
    with open(os.path.join(folder, "notes.txt")) as handle:
        kept = handle.read() == "mine"
    rng_files = sorted(name for name in listed if name.startswith("random_states_"))
    expected = [f"random_states_{rank}.pkl" for rank in range(accelerator.num_processes)]
    check(
        accelerator, "saved_with_two_processes", kept and rng_files == expected and "notes.txt" not in listed
    )


def main() -> None:
    torch.set_num_threads(1)
    mode, where = sys.argv[1], sys.argv[2]
    if mode == "crash":
        crash(where)
    elif mode == "resume":
        resume(where, int(sys.argv[3]))
    elif mode == "fail":
        fail(where, sys.argv[3])
    elif mode == "finish":
        finish_failure(where)
    elif mode == "nodes":
        nodes(where, sys.argv[3] == "1")
    elif mode == "loader":
        loader_checkpoint(where)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
