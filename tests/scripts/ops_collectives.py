"""Checks every collective of drivetrain.operations / drivetrain.operations.random in N real processes (gloo).

Launched by tests/ops/test_operations_multiprocess.py; with DRIVETRAIN_DEBUG_MODE=1 it also checks that
mismatched inputs raise DistributedOperationException on every rank instead of hanging. Prints
"ops_collectives OK rank=<r>" when every check passed.
"""

from __future__ import annotations

import collections
import random

import numpy as np
import torch

from drivetrain.operations import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_for_metrics,
    gather_object,
    pad_across_processes,
    reduce,
)
from drivetrain.operations.random import set_seed, synchronize_rng_states
from drivetrain.state import GradientState, PartialState

Pair = collections.namedtuple("Pair", "first second")

state = PartialState()
rank, world = state.process_index, state.num_processes
assert world > 1, "launch this script in several processes"


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def check_gather() -> None:
    local = torch.arange(3) + 10 * rank
    assert equal(gather(local), torch.cat([torch.arange(3) + 10 * r for r in range(world)]))
    matrix = torch.full((2, 3), float(rank))
    assert equal(gather(matrix), torch.cat([torch.full((2, 3), float(r)) for r in range(world)]))
    # A scalar becomes one element per process.
    assert equal(gather(torch.tensor(rank)), torch.arange(world))
    # Non-contiguous input.
    transposed = torch.arange(6).reshape(2, 3).t() + rank
    assert equal(gather(transposed), torch.cat([torch.arange(6).reshape(2, 3).t() + r for r in range(world)]))
    nested = {"a": local, "b": (matrix, [torch.tensor([rank * 1.5])]), "p": Pair(local, local * 2)}
    out = gather(nested)
    assert type(out) is dict and type(out["b"]) is tuple and type(out["b"][1]) is list
    assert type(out["p"]) is Pair
    assert equal(out["p"].second, torch.cat([(torch.arange(3) + 10 * r) * 2 for r in range(world)]))
    assert equal(out["b"][1][0], torch.tensor([r * 1.5 for r in range(world)]))
    flags = gather(torch.tensor([rank % 2 == 0]))
    assert flags.tolist() == [r % 2 == 0 for r in range(world)]


def check_gather_object() -> None:
    out = gather_object([f"r{rank}-a", f"r{rank}-b"])
    assert out == [f"r{r}-{x}" for r in range(world) for x in "ab"], out
    assert gather_object({"rank": rank}) == [{"rank": r} for r in range(world)]
    # Uneven lengths are fine for objects.
    assert gather_object(list(range(rank + 1))) == [i for r in range(world) for i in range(r + 1)]


def check_broadcast() -> None:
    source = world - 1  # a non-zero rank
    data = {"x": torch.full((2, 2), float(rank)), "p": Pair(torch.tensor([rank]), [torch.arange(3) * rank])}
    out = broadcast(data, from_process=source)
    assert out["x"] is data["x"], "broadcast fills the tensors in place"
    assert equal(out["x"], torch.full((2, 2), float(source)))
    assert type(out["p"]) is Pair and equal(out["p"].first, torch.tensor([source]))
    assert equal(out["p"].second[0], torch.arange(3) * source)
    strided = torch.zeros(3, 2).t()
    if rank == source:
        strided.copy_(torch.arange(6.0).reshape(2, 3))
    broadcast(strided, from_process=source)
    assert equal(strided, torch.arange(6.0).reshape(2, 3))
    objects = [rank, f"from {rank}", {"k": rank}]
    same = broadcast_object_list(objects, from_process=source)
    assert same is objects and objects == [source, f"from {source}", {"k": source}]
    try:
        broadcast(torch.zeros(1), from_process=world)
    except ValueError as error:
        assert "from_process" in str(error)
    else:
        raise AssertionError("broadcast from a process that does not exist must fail")
    shared = copy_tensor_to_devices(torch.arange(4.0).reshape(2, 2) if rank == 0 else None)
    assert equal(shared, torch.arange(4.0).reshape(2, 2))


def check_reduce() -> None:
    # The documented example: torch.arange(world) + 1 + 2 * rank, summed.
    values = torch.arange(world) + 1 + 2 * rank
    expected_sum = sum(torch.arange(world) + 1 + 2 * r for r in range(world))
    assert equal(reduce(values, reduction="sum"), expected_sum)
    assert equal(values, torch.arange(world) + 1 + 2 * rank), "reduce must not modify its input"
    mean = reduce(values, reduction="mean")
    assert mean.is_floating_point() and torch.allclose(mean, expected_sum / world)
    floats = {"a": torch.tensor([float(rank)]), "b": [Pair(torch.tensor([2.0 * rank]), torch.ones(2))]}
    out = reduce(floats)  # default: mean
    assert type(out["b"][0]) is Pair
    assert torch.allclose(out["a"], torch.tensor([sum(range(world)) / world]))
    assert torch.allclose(out["b"][0].first, torch.tensor([2.0 * sum(range(world)) / world]))
    assert equal(reduce(torch.tensor([rank]), reduction="max"), torch.tensor([world - 1]))
    assert equal(reduce(torch.tensor([rank]), reduction="min"), torch.tensor([0]))
    assert equal(reduce(torch.tensor([float(rank)]), reduction="none"), torch.tensor([float(rank)]))
    scaled = reduce(torch.tensor([1.0]), reduction="sum", scale=0.5)
    assert torch.allclose(scaled, torch.tensor([world * 0.5]))


def check_pad() -> None:
    local = torch.arange(rank + 1) + 1  # rank r holds r + 1 elements
    padded = pad_across_processes(local)
    assert equal(padded, torch.cat([local, torch.zeros(world - rank - 1, dtype=local.dtype)]))
    first = pad_across_processes(local, pad_index=-1, pad_first=True)
    assert equal(first, torch.cat([torch.full((world - rank - 1,), -1), local]))
    assert equal(gather(padded).reshape(world, world)[:, 0], torch.ones(world, dtype=local.dtype))
    wide = torch.ones(2, rank + 2)
    out = pad_across_processes({"w": wide, "l": [local]}, dim=1, pad_index=7)
    assert out["w"].shape == (2, world + 1)
    assert bool((out["w"][:, rank + 2 :] == 7).all()) and bool((out["w"][:, : rank + 2] == 1).all())
    assert out["l"][0] is local, "a tensor without the padded dimension is left alone"
    negative = pad_across_processes(wide, dim=-1)
    assert negative.shape == (2, world + 1)


class LastBatch:
    """What a prepared data loader tells GradientState on its last batch (see state.GradientState)."""

    def __init__(self, end_of_dataloader: bool, remainder: int) -> None:
        self.end_of_dataloader = end_of_dataloader
        self.remainder = remainder


def check_gather_for_metrics() -> None:
    # 7 samples, 2 per process per batch, even_batches: the last global batch holds the real samples
    # 2*world*k ... 6 and is completed by wrapping around to the start of the dataset.
    dataset_size, per_process = 7, 2
    global_batch = per_process * world
    last_start = (dataset_size - 1) // global_batch * global_batch
    real = list(range(last_start, dataset_size))
    wrapped = (real + list(range(global_batch)))[:global_batch]
    local = torch.tensor(wrapped[rank * per_process : (rank + 1) * per_process])
    gradient_state = GradientState()
    loader = LastBatch(end_of_dataloader=True, remainder=len(real))
    gradient_state._add_dataloader(loader)
    try:
        assert gather_for_metrics(local).tolist() == real
        predictions, labels = gather_for_metrics((local, local * 10))
        assert predictions.tolist() == real and labels.tolist() == [10 * x for x in real]
        nested = gather_for_metrics({"p": Pair(local, local + 1)})
        assert type(nested["p"]) is Pair and nested["p"].second.tolist() == [x + 1 for x in real]
        # Python objects go through gather_object, then are cut the same way.
        assert gather_for_metrics([f"s{x}" for x in local.tolist()]) == [f"s{x}" for x in real]
        as_objects = gather_for_metrics(local, use_gather_object=True)
        assert [int(x) for x in as_objects] == real
        loader.remainder = -1  # unknown length: nothing is dropped
        assert gather_for_metrics(local).tolist() == wrapped
        loader.end_of_dataloader, loader.remainder = False, len(real)  # not the last batch
        assert gather_for_metrics(local).tolist() == wrapped
    finally:
        gradient_state._remove_dataloader(loader)
    assert gather_for_metrics(local).tolist() == wrapped  # no active loader


def check_rng() -> None:
    set_seed(1234, device_specific=True)
    draws = gather(torch.rand(1))
    assert len(set(draws.tolist())) == world, "device_specific seeds differ per process"
    python_draw = random.random()
    generator = torch.Generator().manual_seed(100 + rank)
    synchronize_rng_states(["torch", "generator"], generator=generator)
    torch_draws = gather(torch.rand(3)).reshape(world, 3)
    generator_draws = gather(torch.rand(3, generator=generator)).reshape(world, 3)
    assert all(equal(torch_draws[0], row) for row in torch_draws), "torch rng synchronised from rank 0"
    assert all(equal(generator_draws[0], row) for row in generator_draws), "generator synchronised"
    # Every process now continues rank 0's generator (seeded with 100, nothing drawn yet).
    assert equal(generator_draws[0], torch.rand(3, generator=torch.Generator().manual_seed(100)))
    # Only the asked-for generators move: Python's random still differs per process.
    assert len(set(gather_object([python_draw]))) == world
    set_seed(7)
    common = gather(torch.tensor([random.random(), float(np.random.rand()), torch.rand(1).item()]))
    assert all(equal(common[:3], common[3 * r : 3 * r + 3]) for r in range(world)), "set_seed(7) is shared"


def expect_mismatch(call, *fragments: str) -> None:
    try:
        call()
    except DistributedOperationException as error:
        message = str(error)
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} not in {message!r}"
    else:
        raise AssertionError("debug mode must raise on mismatched inputs")


def check_debug_mode() -> None:
    assert state.debug
    rows = 4 if rank == 0 else 2
    shapes = ", ".join(f"rank {r} ({4 if r == 0 else 2}, 3)" for r in range(world) if r < 2)
    if world == 2:
        expect_mismatch(lambda: gather(torch.zeros(rows, 3)), "gather: tensor shapes differ", shapes)
    else:
        expect_mismatch(
            lambda: gather(torch.zeros(rows, 3)),
            "gather: tensor shapes differ",
            "rank 0 (4, 3)",
            f"ranks {', '.join(map(str, range(1, world)))} (2, 3)",
            "pad_across_processes",
        )
    expect_mismatch(lambda: gather({"x": [torch.zeros(1), torch.zeros(rank + 1)]}), "at data['x'][1]")
    expect_mismatch(
        lambda: broadcast(torch.zeros(rank + 1), from_process=0), "broadcast: tensor shapes differ"
    )
    expect_mismatch(lambda: reduce(torch.zeros(1, rank + 1)), "reduce: tensor shapes differ")
    expect_mismatch(
        lambda: gather(torch.zeros(2, dtype=torch.int64 if rank else torch.float32)), "dtypes differ"
    )
    structure = [torch.zeros(1)] * (1 + rank)
    expect_mismatch(lambda: gather(structure), "gather: the data structure differs")
    expect_mismatch(lambda: pad_across_processes(torch.zeros([1] * (rank + 1))), "numbers of dimensions")
    # After raising on every rank the processes are still in step.
    assert equal(gather(torch.tensor([rank])), torch.arange(world))


check_gather()
check_gather_object()
check_broadcast()
check_reduce()
check_pad()
check_gather_for_metrics()
check_rng()
if state.debug:
    check_debug_mode()
state.destroy_process_group()
print(f"ops_collectives OK rank={rank} world={world} debug={state.debug}", flush=True)
