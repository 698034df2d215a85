"""Per-step overhead of a prepared one-process training loop against the same raw PyTorch loop.

    python bench/step_overhead.py [--steps 2000] [--repeats 7] [--reference-python /tmp/ref-venv/bin/python]

Tiny MLP on CPU, batch 8, one thread (the setting where framework overhead shows most). The batches are
pre-built tensors, so this measures the step (forward, backward, optimizer), not the data loader — see
bench/dataloader_overhead.py for that. Reports the median over repeats of the per-step CPU time and the
ratio prepared / raw. With --reference-python, runs the same loop with accelerate's Accelerator in that
interpreter. Target (issue 2): <= 1.05x raw; accelerate measured 1.43x on this kind of machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

torch.set_num_threads(1)


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(8, 32), torch.randn(8, 1)) for _ in range(64)]
    return model, optimizer, batches


def run_raw(steps: int) -> float:
    model, optimizer, batches = build()
    start = time.process_time()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.process_time() - start) / steps


def run_prepared(steps: int, accelerator_class) -> float:
    accelerator = accelerator_class()
    model, optimizer, batches = build()
    model, optimizer = accelerator.prepare(model, optimizer)
    start = time.process_time()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return (time.process_time() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--reference-python", default=None)
    parser.add_argument("--only", choices=["accelerate"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only == "accelerate":
        from accelerate import Accelerator as Reference

        ratios = []
        for _ in range(args.repeats):
            raw = run_raw(args.steps)
            ratios.append(run_prepared(args.steps, Reference) / raw)
        print(statistics.median(ratios))
        return

    from drivetrain import Accelerator

    run_raw(200), run_prepared(200, Accelerator)  # warm up allocator and autograd
    raw_times, ours_times = [], []
    for _ in range(args.repeats):
        raw_times.append(run_raw(args.steps))
        ours_times.append(run_prepared(args.steps, Accelerator))
    ratios = [ours / raw for ours, raw in zip(ours_times, raw_times)]
    print(f"raw step        {statistics.median(raw_times) * 1e6:8.1f} us CPU")
    print(
        f"prepared step   {statistics.median(ours_times) * 1e6:8.1f} us CPU   ratio {statistics.median(ratios):.3f}x"
    )
    if args.reference_python:
        result = subprocess.run(
            [
                args.reference_python,
                __file__,
                "--only",
                "accelerate",
                "--steps",
                str(args.steps),
                "--repeats",
                str(args.repeats),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"accelerate step ratio {float(result.stdout.strip().splitlines()[-1]):.3f}x raw")


if __name__ == "__main__":
    main()
