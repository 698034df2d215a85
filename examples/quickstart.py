"""A real (small) training job: classify points of two interleaved spirals with an MLP.

Runs on one CPU in a few seconds, and unchanged on N processes:

    python examples/quickstart.py
    drivetrain launch --cpu --num_processes 2 examples/quickstart.py

The data is generated here (no download). It prints the loss per epoch and the final accuracy, and exits
non-zero if the model did not learn (accuracy below 90%).
"""

from __future__ import annotations

import argparse
import math

import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Accelerator
from drivetrain.utils import set_seed


def make_spirals(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    turns = torch.rand(samples, generator=generator) * 3 * math.pi
    labels = torch.randint(0, 2, (samples,), generator=generator)
    angle = turns + labels * math.pi
    points = torch.stack([turns * torch.cos(angle), turns * torch.sin(angle)], dim=1) / (3 * math.pi)
    points += 0.02 * torch.randn(points.shape, generator=generator)
    return TensorDataset(points, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--mixed-precision", default=None, choices=["no", "bf16", "fp16"])
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(0)
    train_loader = DataLoader(make_spirals(4096, seed=1), batch_size=args.batch_size, shuffle=True)
    eval_loader = DataLoader(make_spirals(1024, seed=2), batch_size=256)
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 2),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr * 3, total_steps=args.epochs * len(train_loader)
    )
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler
    )
    accelerator.print(
        f"training on {accelerator.num_processes} process(es), backend {accelerator.backend_plugin}, "
        f"device {accelerator.device}, precision {accelerator.mixed_precision}"
    )

    for epoch in range(args.epochs):
        model.train()
        total = torch.zeros((), device=accelerator.device)
        for points, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(model(points), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            total += loss.detach()
        mean_loss = accelerator.reduce(total, "mean").item() / len(train_loader)
        if epoch % 5 == 4 or epoch == args.epochs - 1:
            accelerator.print(f"epoch {epoch + 1:3d}  loss {mean_loss:.4f}")

    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for points, labels in eval_loader:
            predictions = model(points).argmax(dim=1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += (predictions == labels).sum().item()
            seen += labels.numel()
    accuracy = correct / seen
    accelerator.print(f"accuracy {accuracy:.3f} on {seen} evaluation samples")
    accelerator.end_training()
    if accuracy < 0.9:
        raise SystemExit(f"the model did not learn: accuracy {accuracy:.3f} < 0.9")


if __name__ == "__main__":
    main()
