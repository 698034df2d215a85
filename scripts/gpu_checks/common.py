"""Shared helpers of the GPU checks: the device to run on, a tiny regression task, one RESULT line per check.

Each check prints ``RESULT <name> PASS|FAIL|SKIP <number> <reason>`` and exits non-zero on FAIL.
DRIVETRAIN_GPU_CHECKS_ALLOW_CPU=1 lets a check run on CPU (gloo) so the script can be dry-run without a GPU."""

from __future__ import annotations

import os
import sys
import traceback

import torch

ALLOW_CPU = os.environ.get("DRIVETRAIN_GPU_CHECKS_ALLOW_CPU") == "1"
DIM = 32  # multiples of 16: torchao converts only such Linear layers


def device_or_exit(name: str) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if ALLOW_CPU:
        return torch.device("cpu")
    result(name, "FAIL", 0, "no CUDA device (set DRIVETRAIN_GPU_CHECKS_ALLOW_CPU=1 for a CPU dry run)")
    raise AssertionError("unreachable")


def result(name: str, status: str, number: float, reason: str) -> None:
    print(f"RESULT {name} {status} {number:.6g} {reason}", flush=True)
    if status == "FAIL":
        sys.exit(1)


class Skip(Exception):
    """Raised by a check that cannot run here; its message is the reason."""


def run_checks(checks: list) -> int:
    """Run every (name, function) pair; a function returns (ok, number, reason). Each prints one RESULT line;
    an exception is a FAIL with its first line (the traceback goes to the log). Returns the exit code."""
    failed = False
    for name, function in checks:
        try:
            ok, number, reason = function()
            status = "PASS" if ok else "FAIL"
        except Skip as skip:
            status, number, reason = "SKIP", 0, str(skip)
            ok = True
        except Exception as error:
            traceback.print_exc()
            ok, status, number = False, "FAIL", 0
            reason = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        print(f"RESULT {name} {status} {number:.6g} {reason}", flush=True)
        failed |= not ok
    return 1 if failed else 0


def make_model(seed: int = 0, hidden: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, DIM),
    )


def dataset(rows: int = 256) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(rows, DIM, generator=generator)
    w = torch.randn(DIM, DIM, generator=generator) / DIM**0.5
    return torch.utils.data.TensorDataset(x, torch.tanh(x @ w))


def max_difference(a: dict, b: dict) -> float:
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def train_plain(device: torch.device, steps: int, lr: float = 0.05, batch: int = 16) -> dict:
    """The reference: the same model, data and optimizer trained by hand, no drivetrain."""
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=batch)
    for _, (x, y) in zip(range(steps), loader):
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().float().cpu() for k, v in model.state_dict().items()}


def prepared_task(
    accelerator,
    optimizer_class: type = torch.optim.SGD,
    lr: float = 0.05,
    hidden: int = 64,
    rows: int = 256,
    batch: int = 16,
) -> tuple:
    """make_model(hidden=hidden), its optimizer and a loader over dataset(rows), through accelerator.prepare.
    The defaults are train_plain's, so that a check can compare with that hand loop."""
    model = make_model(hidden=hidden)
    optimizer = optimizer_class(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(dataset(rows), batch_size=batch)
    return accelerator.prepare(model, optimizer, loader)


def train_on(accelerator, model, optimizer, batches) -> None:
    """One optimizer step per (x, y) batch on the mean squared error, backward through the accelerator."""
    for x, y in batches:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()


def train_autocast(accelerator, model, optimizer, loader, epochs: int) -> list[float]:
    """``epochs`` passes over loader with the forward under accelerator.autocast() and the loss in fp32; the
    loss of every step."""
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.autocast():
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def against_hand_loop(ours: dict, device: torch.device, steps: int) -> tuple[float, float, float]:
    """For the weights ``ours`` trained ``steps`` steps from make_model(): the largest difference from
    train_plain's, and the dataset loss at the start and with ``ours``."""
    diff = max_difference(ours, train_plain(device, steps))
    return diff, dataset_loss(make_model().state_dict()), dataset_loss(ours)


def dataset_loss(state: dict) -> float:
    """Mean squared error of make_model() carrying ``state`` over the whole dataset (on CPU, in fp32)."""
    model = make_model()
    model.load_state_dict({k: v.float().cpu() for k, v in state.items()})
    x, y = dataset().tensors
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))
