"""Train a small model with dropout on a shuffling loader; stop after a checkpoint and resume in a new process.

    python ckpt_resume.py full   OUT EPOCHS [N,M..]   -> OUT/final_full.pt; also saves OUT/ckpt_<N> after N
                                                         optimizer steps and goes on
    python ckpt_resume.py first  OUT EPOCHS N         -> OUT/ckpt_<N>, then stops
    python ckpt_resume.py second OUT EPOCHS N HOW     -> resumes from OUT/ckpt_<N>: OUT/final_<N>_<HOW>.pt; HOW is
                                                         "state" (the loader's saved position) or "skip"
                                                         (skip_first_batches, as Accelerate scripts do)
Works under torchrun (DDP, 2 ranks) and alone. Dropout makes the result depend on the restored RNG states.
"""

from __future__ import annotations

import os
import sys

import torch

from drivetrain import Accelerator
from drivetrain.utils import set_seed


class Progress:
    """Where the training loop stands; registered for checkpointing so a resumed run knows its epoch."""

    def __init__(self) -> None:
        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.step_in_epoch, self.global_step = (
            state["epoch"],
            state["step_in_epoch"],
            state["global_step"],
        )


def main() -> None:
    mode, out, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    save_at = [int(n) for n in sys.argv[4].split(",")] if len(sys.argv) > 4 else []
    how = sys.argv[5] if len(sys.argv) > 5 else "state"
    torch.set_num_threads(1)
    # A resumed run starts from another seed: everything random must come back from the checkpoint.
    set_seed(1234 if mode == "second" else 0)
    data_generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(48, 8, generator=data_generator)
    targets = torch.randn(48, 1, generator=data_generator)
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    torch.manual_seed(99)  # same initial weights in every mode (the checkpoint overwrites them anyway)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
    )
    set_seed(1234 if mode == "second" else 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
    # CKPT_GENERATOR=global: the loader shuffles from the global RNG, as most scripts do.
    own = os.environ.get("CKPT_GENERATOR", "own") == "own"
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5) if own else None
    )

    accelerator = Accelerator()
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    first_loader = loader
    if mode == "second":
        accelerator.load_state(os.path.join(out, f"ckpt_{save_at[0]}"))
        if how == "skip":
            first_loader = accelerator.skip_first_batches(loader, progress.step_in_epoch)

    def maybe_save() -> None:
        if mode == "second" or progress.global_step not in save_at:
            return
        accelerator.save_state(os.path.join(out, f"ckpt_{progress.global_step}"))
        if mode == "first":
            accelerator.end_training()
            sys.exit(0)

    for epoch in range(progress.epoch, epochs):
        progress.epoch = epoch
        for batch_inputs, batch_targets in first_loader if epoch == progress.epoch else loader:
            loss = torch.nn.functional.mse_loss(model(batch_inputs), batch_targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step_in_epoch += 1
            progress.global_step += 1
            if progress.step_in_epoch < len(loader):
                maybe_save()
        first_loader = loader
        progress.epoch, progress.step_in_epoch = epoch + 1, 0
        maybe_save()

    if mode == "full":
        accelerator.save_model(model, os.path.join(out, "export"), max_shard_size="1KB")
    if accelerator.is_main_process:
        name = "final_full.pt" if mode == "full" else f"final_{save_at[0]}_{how}.pt"
        torch.save(accelerator.get_state_dict(model), os.path.join(out, name))
    accelerator.end_training()


if __name__ == "__main__":
    main()
