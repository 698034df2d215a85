"""Started by `drivetrain launch --backend deepspeed ...`: the launch options reach the engine.

Arguments: the expected ZeRO stage and gradient clipping ("none" when not set).
"""

from __future__ import annotations

import os
import sys

import torch

from drivetrain import Accelerator


def check(name: str, condition: bool) -> None:
    if not condition:
        raise AssertionError(f"check {name} failed")
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"CHECK {name} ok", flush=True)


stage, clipping = int(sys.argv[1]), sys.argv[2]
accelerator = Accelerator()
check("launched_deepspeed", accelerator.distributed_type == "DEEPSPEED" and accelerator.num_processes == 2)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
features = torch.randn(16, 4)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(features, features @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])),
    batch_size=2,
)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
check(f"launched_stage_{stage}", model.zero_optimization_stage() == stage)
if clipping != "none":
    check("launched_clipping", model.gradient_clipping() == float(clipping))


def mean_loss() -> float:
    with torch.no_grad():
        return sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in loader)


before = mean_loss()
for _ in range(3):
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
check("launched_trains", mean_loss() < before)
# DeepSpeed's launcher (deepspeed.launcher.launch) sets CROSS_RANK; torch's elastic launcher does not.
if "CROSS_RANK" in os.environ:
    check("launched_by_deepspeed_runner", True)
accelerator.end_training()
