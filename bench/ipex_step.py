"""A training step with ipex asked for (``Accelerator(plugins=["ipex"])``) against the same ipex.optimize loop
written by hand. Runs only in the pinned ipex env:

    PY=$(scripts/pinned-env ipex); $PY bench/ipex_step.py [--steps 1000] [--repeats 7] [--precisions no,bf16]

MLP 64-256-256-1, batch 32, SGD with momentum (IPEX's fused step), one thread. The hand-written loop is what
a user of IPEX writes: ``ipex.optimize(model, optimizer=optimizer, dtype=..., inplace=True)`` and, for bf16,
the forward under ``torch.autocast("cpu", torch.bfloat16)``; bf16 uses ``weights_prepack=False`` on both
sides when this CPU cannot prepack bf16 weights (no AVX-512/AMX), as the plugin does. Reports the median over
repeats of the per-step CPU time and of the ratio prepared / by hand. Target (issue 22): <= 1.05x.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

torch.set_num_threads(1)


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = [(torch.randn(32, 64), torch.randn(32, 1)) for _ in range(64)]
    return model, optimizer, batches


def run_by_hand(steps: int, precision: str, prepack: bool) -> float:
    import intel_extension_for_pytorch as ipex

    model, optimizer, batches = build()
    dtype = torch.bfloat16 if precision == "bf16" else None
    options = {} if prepack else {"weights_prepack": False}
    ipex.optimize(model, optimizer=optimizer, dtype=dtype, inplace=True, **options)
    bf16 = precision == "bf16"
    start = time.process_time()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            output = model(x)
        loss = torch.nn.functional.mse_loss(output.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.process_time() - start) / steps


def run_prepared(steps: int, precision: str) -> float:
    from drivetrain import Accelerator

    accelerator = Accelerator(mixed_precision=precision, plugins=["ipex"])
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
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--precisions", default="no,bf16")
    args = parser.parse_args()

    import logging

    logging.getLogger("IPEX").setLevel(logging.ERROR)  # its deprecation notes, on every by-hand optimize
    from drivetrain_ipex.optimize import bf16_prepack_supported

    for precision in args.precisions.split(","):
        prepack = precision != "bf16" or bf16_prepack_supported()
        run_by_hand(100, precision, prepack), run_prepared(100, precision)  # warm up
        hand_times, prepared_times = [], []
        for _ in range(args.repeats):
            hand_times.append(run_by_hand(args.steps, precision, prepack))
            prepared_times.append(run_prepared(args.steps, precision))
        ratios = [prepared / hand for prepared, hand in zip(prepared_times, hand_times)]
        label = f"{precision}{'' if prepack else ' (weights_prepack=False)'}"
        print(f"{label}: by hand {statistics.median(hand_times) * 1e6:8.1f} us CPU per step")
        print(
            f"{label}: prepared {statistics.median(prepared_times) * 1e6:7.1f} us CPU per step   "
            f"ratio {statistics.median(ratios):.3f}x (repeats: {', '.join(f'{r:.3f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
