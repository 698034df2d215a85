"""Check 1: the local backend on the GPU: fp32 / bf16 / fp16 training lowers the loss, and
save_state/load_state resumes bit-exactly (N steps after a save == N steps after loading it)."""

from __future__ import annotations

import functools
import sys
import tempfile

import torch
from common import device_or_exit, prepared_task, run_checks, train_autocast, train_on

from drivetrain import Accelerator
from drivetrain.state import reset_state


def train(precision: str) -> tuple[float, float]:
    reset_state()
    accelerator = Accelerator(mixed_precision=precision)
    model, optimizer, loader = prepared_task(accelerator, torch.optim.AdamW, lr=3e-3)
    assert next(model.parameters()).device.type == accelerator.device.type
    losses = train_autocast(accelerator, model, optimizer, loader, epochs=3)
    accelerator.end_training()
    return sum(losses[:4]) / 4, sum(losses[-4:]) / 4


def resume_exact() -> tuple[bool, float]:
    reset_state()
    accelerator = Accelerator()
    model, optimizer, loader = prepared_task(accelerator, torch.optim.AdamW, lr=3e-3)
    batches = list(loader)

    run = functools.partial(train_on, accelerator, model, optimizer)
    run(batches[:5])
    with tempfile.TemporaryDirectory() as directory:
        accelerator.save_state(directory)
        run(batches[5:12])
        first = [p.detach().clone() for p in model.parameters()]
        run(batches[:3])  # move away, so load_state has something to undo
        accelerator.load_state(directory)
        run(batches[5:12])
    again = [p.detach() for p in model.parameters()]
    diff = max(float((a - b).abs().max()) for a, b in zip(first, again))
    return all(torch.equal(a, b) for a, b in zip(first, again)), diff


def main() -> int:
    device = device_or_exit("local")
    checks = []
    for precision in ("no", "bf16", "fp16"):

        def trains(precision=precision):
            start, end = train(precision)
            return end < 0.7 * start, end / start, f"loss {start:.4f} -> {end:.4f} (pass: ratio < 0.7)"

        checks.append((f"local_{'fp32' if precision == 'no' else precision}_{device.type}", trains))

    def resumes():
        ok, diff = resume_exact()
        return ok, diff, "max |continued - resumed| weight difference after 7 steps (pass: bit-exact)"

    checks.append((f"local_resume_bit_exact_{device.type}", resumes))
    return run_checks(checks)


if __name__ == "__main__":
    sys.exit(main())
