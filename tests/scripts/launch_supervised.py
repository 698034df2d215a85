"""A 2-process job for tests/launch/test_launch_supervision.py and scripts/launcher_kill_stress.py. Each rank writes
its process id into FOLDER (``rank_<r>.pid``), then:

- ``train``: joins the process group, trains and writes a file per step into FOLDER until killed (what a
  user's job does);
- ``idle``: imports drivetrain only (which installs its failure hook in a launched process) and writes a
  file every 50 ms until killed: nothing but the launcher can end it (no collective to fail), and it starts
  in a second rather than importing torch;
- ``raise0``: joins the process group; rank 0 raises a ValueError while the other rank waits for it in a
  collective.

Usage: launch_supervised.py FOLDER MODE
"""

from __future__ import annotations

import os
import sys
import time

folder, mode = sys.argv[1], sys.argv[2]


def write(name: str, text: str) -> None:
    with open(os.path.join(folder, name + ".partial"), "w") as out:
        out.write(text)
    os.replace(os.path.join(folder, name + ".partial"), os.path.join(folder, name))


def work_until_killed(rank: int, step_once=lambda: None) -> None:
    step = 0
    while True:
        step_once()
        step += 1
        write(f"step_rank{rank}.txt", str(step))
        time.sleep(0.05)


if mode == "idle":
    import drivetrain  # noqa: F401

    rank = int(os.environ["RANK"])
    write(f"rank_{rank}.pid", str(os.getpid()))
    work_until_killed(rank)

import torch  # noqa: E402

from drivetrain import Accelerator  # noqa: E402

torch.set_num_threads(1)
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 2)
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
rank = accelerator.process_index
write(f"rank_{rank}.pid", str(os.getpid()))
accelerator.wait_for_everyone()

if mode == "raise0":
    if rank == 0:
        raise ValueError("boom on rank 0")
    accelerator.wait_for_everyone()  # rank 1 waits here for the rank that failed
else:

    def train_step() -> None:
        accelerator.backward(model(torch.randn(3, 4)).sum())
        optimizer.step()
        optimizer.zero_grad()

    work_until_killed(rank, train_step)
