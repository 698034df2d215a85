"""A prepared training step on one XLA device against the same loop written by hand with torch_xla, in
steady state (after compilation), with the compile counts of both. Runs only in the pinned xla env:

    PY=$(scripts/pinned-env xla); PJRT_DEVICE=CPU $PY bench/xla_step.py [--steps 300] [--repeats 5]

MLP 64-256-256-1, batch 32, SGD with momentum, on torch_xla's CPU device. The hand-written loop is what a
torch_xla user writes: batches through ``pl.MpDeviceLoader``, ``loss.backward()``,
``xm.optimizer_step(optimizer)``, and the graph cut by the loader at each batch. The prepared loop is the
Accelerate-style loop (``accelerator.prepare``, ``accelerator.backward``, ``optimizer.step()``). Both read a
loss value only at the end. Times are wall-clock per step (XLA executes on its own threads), the median over
repeats, each repeat running both loops; compile counts come from ``torch_xla.debug.metrics`` (``CompileTime``
samples), and a loop that recompiles per step shows a count growing with ``--steps``. Target (issue 21):
prepared / by hand <= 1.05x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch

BATCH = 32


def dataset(samples: int) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(samples, 64, generator=generator), torch.randn(samples, 1, generator=generator)
    )


def build(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def compiles() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def run_by_hand(steps: int) -> tuple[float, int]:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
    model, optimizer = build()
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = pl.MpDeviceLoader(torch.utils.data.DataLoader(dataset(steps * BATCH), batch_size=BATCH), device)
    iterator = iter(loader)
    for _ in range(3):  # warm-up: compile the step graphs
        x, y = next(iterator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
        optimizer.zero_grad()
    xm.wait_device_ops()
    before = compiles()
    start = time.perf_counter()
    for x, y in iterator:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
        optimizer.zero_grad()
    loss.item()
    xm.wait_device_ops()
    return (time.perf_counter() - start) / (steps - 3), compiles() - before


def run_prepared(steps: int) -> tuple[float, int]:
    import torch_xla.core.xla_model as xm

    import drivetrain
    from drivetrain import Accelerator

    drivetrain.reset_state()
    accelerator = Accelerator()
    assert accelerator.backend == "xla", accelerator.backend
    model, optimizer = build()
    loader = torch.utils.data.DataLoader(dataset(steps * BATCH), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    iterator = iter(loader)
    for _ in range(3):
        x, y = next(iterator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    xm.wait_device_ops()
    before = compiles()
    start = time.perf_counter()
    for x, y in iterator:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    loss.item()
    xm.wait_device_ops()
    return (time.perf_counter() - start) / (steps - 3), compiles() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    start = compiles()
    run_by_hand(20), run_prepared(20)  # first compilations of both loops
    print(f"compiles for the first 20-step run of each loop: {compiles() - start}")
    hand_times, prepared_times, hand_compiles, prepared_compiles = [], [], [], []
    for _ in range(args.repeats):
        seconds, count = run_by_hand(args.steps)
        hand_times.append(seconds)
        hand_compiles.append(count)
        seconds, count = run_prepared(args.steps)
        prepared_times.append(seconds)
        prepared_compiles.append(count)
    ratios = [prepared / hand for prepared, hand in zip(prepared_times, hand_times)]
    print(
        f"by hand : {statistics.median(hand_times) * 1e3:7.3f} ms per step; compiles during the timed "
        f"{args.steps - 3} steps: {hand_compiles}"
    )
    print(
        f"prepared: {statistics.median(prepared_times) * 1e3:7.3f} ms per step; compiles during the timed "
        f"{args.steps - 3} steps: {prepared_compiles}"
    )
    print(
        f"ratio prepared / by hand: {statistics.median(ratios):.3f}x (repeats: {', '.join(f'{r:.3f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
