"""Launched by tests: reports what each process sees (rank, world, env, argv) and trains a tiny model with
torch DDP over the process group the launcher set up; rank 0 writes everything to the JSON file argv[1]."""

import json
import os
import sys

import torch

from drivetrain.state import PartialState

state = PartialState()
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
if state.num_processes > 1:
    model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(100 + state.process_index)  # different data on every rank
for _ in range(5):
    optimizer.zero_grad()
    inputs, targets = torch.randn(4, 3, generator=generator), torch.randn(4, 1, generator=generator)
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
report = {
    "rank": state.process_index,
    "world": state.num_processes,
    "backend": state.backend_name,
    "machine_rank": int(os.environ.get("GROUP_RANK", "0")),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("DRIVETRAIN_", "TEST_"))},
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "argv": sys.argv[2:],
    "weights": weights.tolist(),
}
everyone = state.collectives.all_gather_object(report)
if state.is_main_process:
    with open(sys.argv[1], "w") as handle:
        json.dump(everyone, handle)
state.destroy_process_group()
