"""A prepared training step on one XLA device against the same loop written by hand with torch_xla, in
steady state (after compilation), with the compile counts of both. Runs only in the pinned xla env:

    PY=$(scripts/pinned-env xla); PJRT_DEVICE=CPU $PY bench/xla_step.py [--steps 300] [--repeats 5]

MLP 64-256-256-1, batch 32, SGD with momentum, on torch_xla's CPU device. The hand-written loop is what a
torch_xla user writes: batches through ``pl.MpDeviceLoader``, ``loss.backward()``,
``xm.optimizer_step(optimizer)``, and the graph cut by the loader at each batch. The prepared loop is the
Accelerate-style loop (``accelerator.prepare``, ``accelerator.backward``, ``optimizer.step()``). Both read a
loss value only at the end. Times are per step (XLA executes on its own threads), the median over
repeats, each repeat running both loops; CPU time of the whole process (XLA's threads included) is reported
beside it, being steadier than wall-clock time on a shared machine. Compile counts come from ``torch_xla.debug.metrics`` (``CompileTime``
samples), and a loop that recompiles per step shows a count growing with ``--steps``. Target (issue 21):
prepared / by hand <= 1.05x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

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


@dataclass
class Timing:
    wall: float
    cpu: float
    compiles: int


class _Clock:
    def __init__(self) -> None:
        self.wall, self.cpu, self.compiles = time.perf_counter(), time.process_time(), compiles()

    def stop(self, steps: int) -> Timing:
        return Timing(
            (time.perf_counter() - self.wall) / steps,
            (time.process_time() - self.cpu) / steps,
            compiles() - self.compiles,
        )


def run_by_hand(steps: int) -> Timing:
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
    clock = _Clock()
    for x, y in iterator:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
        optimizer.zero_grad()
    loss.item()
    xm.wait_device_ops()
    return clock.stop(steps - 3)


def run_prepared(steps: int) -> Timing:
    import torch_xla.core.xla_model as xm

    import drivetrain
    from drivetrain import Accelerator

    drivetrain.reset_state()
    accelerator = Accelerator()
    assert accelerator.backend_plugin == "xla", accelerator.backend_plugin
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
    clock = _Clock()
    for x, y in iterator:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    loss.item()
    xm.wait_device_ops()
    return clock.stop(steps - 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    start = compiles()
    run_by_hand(20), run_prepared(20)  # first compilations of both loops
    print(f"compiles for the first 20-step run of each loop: {compiles() - start}")
    hand, prepared = [], []
    for _ in range(args.repeats):
        hand.append(run_by_hand(args.steps))
        prepared.append(run_prepared(args.steps))
    for label, runs in (("by hand ", hand), ("prepared", prepared)):
        print(
            f"{label}: {statistics.median(r.wall for r in runs) * 1e3:7.3f} ms wall, "
            f"{statistics.median(r.cpu for r in runs) * 1e3:7.3f} ms CPU per step; compiles during the timed "
            f"{args.steps - 3} steps of each repeat: {[r.compiles for r in runs]}"
        )
    for what in ("wall", "cpu"):
        ratios = [getattr(p, what) / getattr(h, what) for p, h in zip(prepared, hand)]
        print(
            f"ratio prepared / by hand ({what}): {statistics.median(ratios):.3f}x "
            f"(repeats: {', '.join(f'{r:.3f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
