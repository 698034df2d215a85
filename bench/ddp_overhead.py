"""Per-step overhead of a drivetrain-prepared training step against the same step written in raw torch.

Two comparisons on a tiny MLP (batch 8 per process, one thread, CPU):

* 2 processes (gloo): ``accelerator.prepare`` + ``accelerator.backward`` vs a hand-written
  ``DistributedDataParallel`` loop;
* 1 process: the prepared step vs the plain torch loop.

Blocks of steps alternate between the two variants so that load from other programs hits both alike.
Two figures per variant: the median over blocks of the per-step time, and the fastest block (the least
disturbed by other programs on a shared machine, so the better estimate of the code's own cost).
Target: prepared / raw <= 1.05.

    python bench/ddp_overhead.py [--steps 100] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from drivetrain.testing import launch_script


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )


def time_block(step, inputs: torch.Tensor, targets: torch.Tensor, steps: int, barrier) -> float:
    barrier()
    start = time.perf_counter()
    for index in range(steps):
        step(inputs[index % len(inputs)], targets[index % len(targets)])
    barrier()
    return (time.perf_counter() - start) / steps


def worker(steps: int, rounds: int) -> dict[str, float]:
    """Run inside each process; returns per-step seconds of both variants (measured on every rank)."""
    import torch.distributed as dist

    from drivetrain import Accelerator

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    distributed = accelerator.num_processes > 1

    raw_model = make_model()
    if distributed:
        raw_model = torch.nn.parallel.DistributedDataParallel(raw_model)
    raw_optimizer = torch.optim.SGD(raw_model.parameters(), lr=0.01)

    model = make_model()
    prepared_model, prepared_optimizer = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.01)
    )

    def raw_step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = torch.nn.functional.mse_loss(raw_model(x), y)
        loss.backward()
        raw_optimizer.step()
        raw_optimizer.zero_grad()

    def prepared_step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = torch.nn.functional.mse_loss(prepared_model(x), y)
        accelerator.backward(loss)
        prepared_optimizer.step()
        prepared_optimizer.zero_grad()

    generator = torch.Generator().manual_seed(accelerator.process_index)
    inputs = torch.randn(64, 8, 32, generator=generator)
    targets = torch.randn(64, 8, 1, generator=generator)
    barrier = dist.barrier if distributed else (lambda: None)
    for step in (raw_step, prepared_step):  # warm-up
        time_block(step, inputs, targets, max(steps // 4, 10), barrier)
    raw, prepared = [], []
    for round_index in range(rounds):
        order = (raw_step, prepared_step) if round_index % 2 == 0 else (prepared_step, raw_step)
        for step in order:
            (raw if step is raw_step else prepared).append(time_block(step, inputs, targets, steps, barrier))
    result = {
        "raw": statistics.median(raw),
        "prepared": statistics.median(prepared),
        "raw_min": min(raw),
        "prepared_min": min(prepared),
    }
    accelerator.end_training()
    return result


def run(num_processes: int, steps: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
        output = os.path.join(tmp, "result.json")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": tmp}
        worker_args = ["--worker", "--steps", str(steps), "--rounds", str(rounds), "--output", output]
        if num_processes == 1:
            for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
                env.pop(name, None)
            completed = subprocess.run(
                [sys.executable, __file__, *worker_args], env=env, capture_output=True, text=True
            )
        else:
            completed = launch_script(
                __file__, num_processes, args=worker_args, env={"TMPDIR": tmp}, timeout=3600, check=False
            )
        if completed.returncode != 0:
            raise SystemExit(f"benchmark run failed:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}")
        with open(output) as handle:
            return json.load(handle)


def main() -> int:
    parser = argparse.ArgumentParser(description="prepared vs raw torch step time, 1 and 2 processes")
    parser.add_argument("--steps", type=int, default=100, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=15, help="timed blocks per variant")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(args.steps, args.rounds)
        if int(os.environ.get("RANK", "0")) == 0:
            with open(args.output, "w") as handle:
                json.dump(result, handle)
        return 0
    print(f"tiny MLP, batch 8 per process, 1 thread, {args.rounds} blocks of {args.steps} steps per variant")
    for num_processes, label in ((2, "DDP 2 ranks (gloo)"), (1, "1 process")):
        result = run(num_processes, args.steps, args.rounds)
        for suffix, statistic in (("", "median"), ("_min", "fastest")):
            raw, prepared = result["raw" + suffix], result["prepared" + suffix]
            ratio = prepared / raw
            print(
                f"{label:20s} {statistic:8s} raw {raw * 1e6:8.1f} us/step   prepared {prepared * 1e6:8.1f} us/step"
                f"   ratio {ratio:.3f}  {'ok' if ratio <= 1.05 else 'above target 1.05'}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
