"""Training that survives a crashed process: checkpoint regularly, resume from the latest on start.

Run it with restarts allowed; when a process dies, torch's elastic launcher restarts the whole group, and
every process picks up the latest complete checkpoint:

    drivetrain launch --cpu --num_processes 2 --max_restarts 3 examples/fault_tolerant_training.py --output_dir run

``--crash_at_step N`` makes rank 1 kill itself once at step N (the first time only), to see it work.
"""

from __future__ import annotations

import argparse
import os
import re

import torch

from drivetrain import Accelerator


class Progress:
    """The step counter, saved and restored with the checkpoint."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


def latest_checkpoint(output_dir: str) -> str | None:
    """The complete checkpoint with the highest step (``step_<n>`` folders; partial ones are never renamed
    into place, so every listed folder is complete)."""
    if not os.path.isdir(output_dir):
        return None
    steps = [int(m.group(1)) for name in os.listdir(output_dir) if (m := re.fullmatch(r"step_(\d+)", name))]
    return os.path.join(output_dir, f"step_{max(steps)}") if steps else None


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Data for one step, the same on every run (so a resumed run sees what the crashed one would have)."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint_every", type=int, default=3)
    parser.add_argument("--crash_at_step", type=int, default=-1)
    args = parser.parse_args()

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    checkpoint = latest_checkpoint(args.output_dir)
    if checkpoint is not None:
        accelerator.load_state(checkpoint)
        accelerator.print(f"resumed from {checkpoint} at step {progress.step}")

    marker = os.path.join(args.output_dir, "crashed_once")
    while progress.step < args.steps:
        if (
            progress.step == args.crash_at_step
            and accelerator.process_index == 1
            and not os.path.exists(marker)
        ):
            open(marker, "w").close()
            os._exit(17)  # a hard crash: no cleanup, no exception handling
        inputs, targets = batch(progress.step, accelerator.process_index)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        progress.step += 1
        if progress.step % args.checkpoint_every == 0:
            accelerator.save_state(os.path.join(args.output_dir, f"step_{progress.step}"))

    if accelerator.is_main_process:
        weights = accelerator.unwrap_model(model).state_dict()
        torch.save(
            {k: v.cpu() for k, v in weights.items()}, os.path.join(args.output_dir, "final_weights.pt")
        )
    accelerator.end_training()


if __name__ == "__main__":
    main()
