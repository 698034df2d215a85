"""A 2-process training job for tests/test_launch_supervision.py. Each rank writes its process id into
FOLDER (``rank_<r>.pid``, once it is in the process group), then:

- ``train``: trains and writes a small file per step into FOLDER until killed (what a user's job does);
- ``raise0``: rank 0 raises a ValueError while the other rank waits for it in a collective.

Usage: launch_supervised.py FOLDER MODE
"""

from __future__ import annotations

import os
import sys
import time

import torch

from drivetrain import Accelerator

folder, mode = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 2)
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
rank = accelerator.process_index
with open(os.path.join(folder, f"rank_{rank}.pid.partial"), "w") as out:
    out.write(str(os.getpid()))
os.replace(os.path.join(folder, f"rank_{rank}.pid.partial"), os.path.join(folder, f"rank_{rank}.pid"))
accelerator.wait_for_everyone()

if mode == "raise0":
    if rank == 0:
        raise ValueError("boom on rank 0")
    accelerator.wait_for_everyone()  # rank 1 waits here for the rank that failed
else:
    step = 0
    while True:
        accelerator.backward(model(torch.randn(3, 4)).sum())
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        with open(os.path.join(folder, f"step_rank{rank}.txt"), "w") as out:
            out.write(str(step))
        time.sleep(0.05)
