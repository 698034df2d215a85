"""Checks of the ddp backend, run in N real processes by test_ddp_multiprocess.py (one launch, many checks).

Every rank also computes the single-process reference itself (same data, same initial weights), so
equality with "one process on the full batch" is checked without a second launch.
Prints ``CHECK <name> ok`` per passed check; any failure raises and fails the launch.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from drivetrain import Accelerator, DistributedDataParallelKwargs, LocalSGD
from drivetrain.state import GradientState

PER_RANK_BATCH = 8
FEATURES = 6


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def make_data(num_samples: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(num_samples, FEATURES, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True).sin()
    return inputs, targets


def loss_of(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(inputs), targets)


def gathered(tensor: torch.Tensor) -> list[torch.Tensor]:
    outputs = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(outputs, tensor.detach().contiguous())
    return outputs


def same_on_all_ranks(model: torch.nn.Module) -> bool:
    return all(all(torch.equal(p, other) for other in gathered(p)) for p in model.parameters())


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


class AllReduceCounter:
    """State of :func:`counting_allreduce`: how many gradient buckets were all-reduced."""

    def __init__(self) -> None:
        self.calls = 0


def counting_allreduce(state: AllReduceCounter, bucket):
    """A DDP communication hook: DDP's plain all-reduce, counted."""
    state.calls += 1
    return default_hooks.allreduce_hook(None, bucket)


def count_allreduces(model: torch.nn.Module) -> AllReduceCounter:
    counter = AllReduceCounter()
    model.register_comm_hook(state=counter, hook=counting_allreduce)
    return counter


def my_rows(global_batch: tuple[torch.Tensor, torch.Tensor], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = global_batch
    return inputs[rank * PER_RANK_BATCH : (rank + 1) * PER_RANK_BATCH], targets[
        rank * PER_RANK_BATCH : (rank + 1) * PER_RANK_BATCH
    ]


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        raise AssertionError(f"check {name} failed on rank {dist.get_rank()}: {detail}")
    if dist.get_rank() == 0:
        print(f"CHECK {name} ok", flush=True)


def check_equivalence(accelerator: Accelerator, world: int, rank: int) -> None:
    """2x batch 8 with DDP == one process on batch 16 (and 3x8 == 24)."""
    reference = make_model()
    model = accelerator.prepare(make_model())
    check("ddp_wrapped", isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model).__name__)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    inputs, targets = make_data(PER_RANK_BATCH * world * 5)
    for step in range(5):
        batch = (
            inputs[step * PER_RANK_BATCH * world : (step + 1) * PER_RANK_BATCH * world],
            targets[step * PER_RANK_BATCH * world : (step + 1) * PER_RANK_BATCH * world],
        )
        accelerator.backward(loss_of(model, *my_rows(batch, rank)))
        optimizer.step()
        optimizer.zero_grad()
        loss_of(reference, *batch).backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    unwrapped = accelerator.unwrap_model(model)
    difference = max(
        (ours - theirs).abs().max().item()
        for ours, theirs in zip(unwrapped.parameters(), reference.parameters())
    )
    check("equal_to_full_batch", difference < 1e-6, f"max diff {difference}")
    check("replicas_equal", same_on_all_ranks(unwrapped))


def check_kwargs_reach_ddp(world: int) -> None:
    handler = DistributedDataParallelKwargs(
        find_unused_parameters=True, bucket_cap_mb=1, broadcast_buffers=False
    )
    accelerator = Accelerator(kwargs_handlers=[handler])
    model = accelerator.prepare(make_model())
    check("kwargs_find_unused", model.find_unused_parameters is True)
    check("kwargs_broadcast_buffers", model.broadcast_buffers is False)
    check("kwargs_bucket_cap", model.bucket_bytes_cap == 1024 * 1024, str(model.bucket_bytes_cap))
    evaluation = accelerator.prepare_model(make_model(), evaluation_mode=True)
    check("evaluation_mode_unwrapped", not isinstance(evaluation, torch.nn.parallel.DistributedDataParallel))


def check_accumulation(world: int, rank: int) -> None:
    """accumulate() with 2 steps == full-batch SGD, and all-reduces happen only at the boundaries."""
    accelerator = Accelerator(gradient_accumulation_steps=2)
    reference = make_model()
    model = accelerator.prepare(make_model())
    counter = count_allreduces(model)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    micro = PER_RANK_BATCH // 2
    inputs, targets = make_data(PER_RANK_BATCH * world * 3, seed=2)
    syncs = []
    for step in range(3):
        start = step * PER_RANK_BATCH * world
        batch = (
            inputs[start : start + PER_RANK_BATCH * world],
            targets[start : start + PER_RANK_BATCH * world],
        )
        mine = my_rows(batch, rank)
        for half in range(2):
            before = counter.calls
            with accelerator.accumulate(model):
                accelerator.backward(
                    loss_of(
                        model,
                        mine[0][half * micro : (half + 1) * micro],
                        mine[1][half * micro : (half + 1) * micro],
                    )
                )
                optimizer.step()
                optimizer.zero_grad()
            syncs.append((accelerator.sync_gradients, counter.calls - before))
        loss_of(reference, *batch).backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    check(
        "accumulate_sync_only_at_boundaries",
        [flag for flag, _ in syncs] == [False, True] * 3 and all((n > 0) == flag for flag, n in syncs),
        str(syncs),
    )
    check("accumulate_one_bucket_per_sync", counter.calls == 3, f"{counter.calls} all-reduces")
    unwrapped = accelerator.unwrap_model(model)
    difference = max(
        (ours - theirs).abs().max().item()
        for ours, theirs in zip(unwrapped.parameters(), reference.parameters())
    )
    check("accumulate_equal_to_full_batch", difference < 1e-6, f"max diff {difference}")
    GradientState(gradient_accumulation_plugin=None).plugin_kwargs = {}


def check_no_sync(world: int, rank: int) -> None:
    accelerator = Accelerator()
    model = accelerator.prepare(make_model())
    counter = count_allreduces(model)
    inputs, targets = make_data(PER_RANK_BATCH * world * 2, seed=3)
    first = my_rows((inputs[: PER_RANK_BATCH * world], targets[: PER_RANK_BATCH * world]), rank)
    second = my_rows((inputs[PER_RANK_BATCH * world :], targets[PER_RANK_BATCH * world :]), rank)
    with accelerator.no_sync(model):
        accelerator.backward(loss_of(model, *first))
    local = flat_grads(model).clone()
    check("no_sync_no_allreduce", counter.calls == 0, f"{counter.calls} all-reduces inside no_sync")
    check("no_sync_grads_local", not all(torch.equal(local, other) for other in gathered(local)))
    accelerator.backward(loss_of(model, *second))
    check("sync_after_no_sync", counter.calls == 1, f"{counter.calls} all-reduces")
    # Reference: the average over ranks of (local grads of batch 1 + local grads of batch 2).
    plain = copy.deepcopy(accelerator.unwrap_model(model))
    plain.zero_grad()
    loss_of(plain, *first).backward()
    loss_of(plain, *second).backward()
    expected = torch.stack(gathered(flat_grads(plain))).mean(dim=0)
    check("sync_averages_accumulated", torch.allclose(flat_grads(model), expected, atol=1e-6))

    # trigger_sync_in_backward: forward under no_sync, backward still all-reduces.
    model.zero_grad()
    before = counter.calls
    with accelerator.no_sync(model):
        loss = loss_of(model, *first)
        with accelerator.trigger_sync_in_backward(model):
            accelerator.backward(loss)
    grads = flat_grads(model)
    check(
        "trigger_sync_in_backward",
        counter.calls == before + 1 and all(torch.equal(grads, g) for g in gathered(grads)),
        f"{counter.calls - before} all-reduces",
    )


def check_join(world: int, rank: int) -> None:
    accelerator = Accelerator()
    model = accelerator.prepare(make_model())
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    inputs, targets = make_data(PER_RANK_BATCH * (3 + rank), seed=4 + rank)
    with accelerator.join_uneven_inputs([model]):
        for step in range(3 + rank):  # rank r runs 3 + r steps
            rows = slice(step * PER_RANK_BATCH, (step + 1) * PER_RANK_BATCH)
            accelerator.backward(loss_of(model, inputs[rows], targets[rows]))
            optimizer.step()
            optimizer.zero_grad()
    check("join_uneven_inputs_finishes_equal", same_on_all_ranks(accelerator.unwrap_model(model)))


def check_local_sgd(world: int, rank: int) -> None:
    accelerator = Accelerator()
    model = accelerator.prepare(make_model())
    counter = count_allreduces(model)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    inputs, targets = make_data(PER_RANK_BATCH * 7, seed=10 + rank)  # different data per rank
    unwrapped = accelerator.unwrap_model(model)
    equal_after = []
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=3) as local_sgd:
        for step in range(7):
            rows = slice(step * PER_RANK_BATCH, (step + 1) * PER_RANK_BATCH)
            accelerator.backward(loss_of(model, inputs[rows], targets[rows]))
            optimizer.step()
            optimizer.zero_grad()
            if step == 2:
                before_average = [p.detach().clone() for p in unwrapped.parameters()]
            local_sgd.step()
            equal_after.append(same_on_all_ranks(unwrapped))
            if step == 2:
                for averaged, local in zip(unwrapped.parameters(), before_average):
                    check(
                        "local_sgd_is_mean",
                        torch.allclose(averaged, torch.stack(gathered(local)).mean(0), atol=1e-6),
                    )
    check("local_sgd_no_grad_allreduce", counter.calls == 0, f"{counter.calls} all-reduces")
    check(
        "local_sgd_averages_every_3",
        equal_after == [False, False, True, False, False, True, False],
        str(equal_after),
    )
    check("local_sgd_averages_on_exit", same_on_all_ranks(unwrapped))


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator()
    world, rank = accelerator.num_processes, accelerator.process_index
    assert world > 1 and accelerator.state.backend_name == "ddp", accelerator.state
    sections = sys.argv[1:] or ["equivalence", "kwargs", "accumulation", "no_sync", "join", "local_sgd"]
    for section in sections:
        if section == "equivalence":
            check_equivalence(accelerator, world, rank)
        elif section == "kwargs":
            check_kwargs_reach_ddp(world)
        elif section == "accumulation":
            check_accumulation(world, rank)
        elif section == "no_sync":
            check_no_sync(world, rank)
        elif section == "join":
            check_join(world, rank)
        elif section == "local_sgd":
            check_local_sgd(world, rank)
    Accelerator().end_training()


if __name__ == "__main__":
    main()
