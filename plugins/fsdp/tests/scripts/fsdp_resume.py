"""Resume a SHARDED checkpoint on this run's number of processes (DCP reshards it) and continue.

Usage: fsdp_resume.py LOAD_DIR FIRST_STEP EXPECTED [SAVE_DIR EXPECTED_OUT]
Loads LOAD_DIR, trains steps FIRST_STEP and FIRST_STEP+1 and compares the weights with EXPECTED (written by
a run on another number of processes). With SAVE_DIR, first saves a checkpoint right after loading and
writes the weights after the two steps to EXPECTED_OUT, for the run that resumes it elsewhere.
"""

from __future__ import annotations

import sys

import torch
from fsdp_common import check, full_parameters, make_model, max_difference, train_steps

from drivetrain import Accelerator, FullyShardedDataParallelPlugin


def main() -> None:
    torch.set_num_threads(1)
    load_dir, first_step, expected_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"])
    accelerator = Accelerator(fsdp_plugin=plugin)
    world = accelerator.num_processes
    model = make_model(seed=7)
    model.scale.fill_(1.0)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.05))
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9))
    accelerator.load_state(load_dir)
    if len(sys.argv) > 4:
        accelerator.save_state(sys.argv[4])
    train_steps(accelerator, model, optimizer, range(first_step, first_step + 2))
    weights = full_parameters(model)
    difference = max_difference(weights, torch.load(expected_path))
    check(f"resume_on_{world}_equals_uninterrupted", difference < 2e-5, f"max diff {difference}")
    check(
        f"resume_on_{world}_scheduler",
        scheduler.get_last_lr() == [0.05 * 0.9**2],
        str(scheduler.get_last_lr()),
    )
    if len(sys.argv) > 4 and accelerator.is_main_process:
        torch.save(weights, sys.argv[5])
    accelerator.end_training()


if __name__ == "__main__":
    main()
