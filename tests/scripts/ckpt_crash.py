"""Save checkpoint_0, train a step, and start saving checkpoint_1 — but SIGKILL this process at the stage named
by CKPT_KILL_AT (``file:<n>``: after the n-th file of the second save is written; or a stage:
``objects_written`` before save_state returns, then ``files_synced``, ``manifest_written``, ``renamed`` while
the save finishes in the background, which the script's exit waits for; into an existing folder,
``committed``, ``file_moved`` (the first file put in place) and ``published`` instead of ``renamed``).

    python ckpt_crash.py PROJECT_DIR TOTAL_LIMIT [FOLDER]

With FOLDER, both saves go into that one folder (``save_state(FOLDER)``, which may hold the user's own
files) instead of automatic ``checkpoint_<n>`` folders. Before each save, the weights it will contain are
written to PROJECT_DIR/expected_<n>.pt.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from drivetrain import Accelerator
from drivetrain.checkpoint import files
from drivetrain.utils import ProjectConfiguration, set_seed


def install_kill_switch(kill_at: str) -> None:
    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if kill_at.startswith("file:"):
        remaining = [int(kill_at.split(":")[1])]

        def after_file(path: str) -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                die()

        files.on_file_written = after_file
    else:
        files.on_stage = lambda stage, path: die() if stage == kill_at else None


def main() -> None:
    project_dir, total_limit = sys.argv[1], int(sys.argv[2])
    folder = sys.argv[3] if len(sys.argv) > 3 else None
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    config = ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=folder is None, total_limit=total_limit
    )
    accelerator = Accelerator(project_config=config)
    model, optimizer = accelerator.prepare(model, optimizer)
    for iteration in range(2):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        torch.save(accelerator.get_state_dict(model), os.path.join(project_dir, f"expected_{iteration}.pt"))
        if iteration == 1:
            accelerator.wait_for_checkpoint()  # checkpoint_0 is complete before anything may die
            install_kill_switch(os.environ["CKPT_KILL_AT"])
        accelerator.save_state(folder)
    print("second save finished without being killed")


if __name__ == "__main__":
    main()
