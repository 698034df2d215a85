"""Started by `drivetrain launch --backend deepspeed ...`: the launch options reach the engine.

Argument: JSON of what must hold: ``stage`` (the engine's ZeRO stage), ``config`` (dotted keys of the
engine's DeepSpeed config -> value), ``plugin`` (attributes of ``accelerator.deepspeed_plugin`` -> value),
``moe_leaf`` (a class name whose modules must be ZeRO-3 leaf modules). Under DeepSpeed's own launcher the
script ends without ``end_training()``: the kernel's exit handler must leave the process group.
"""

from __future__ import annotations

import atexit
import json
import os
import sys

import torch
import torch.distributed as dist
from drivetrain_deepspeed.engine import record_of_engine
from drivetrain_deepspeed.paths import get_path

from drivetrain import Accelerator


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        raise AssertionError(f"check {name} failed {detail}")
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"CHECK {name} ok", flush=True)


class Experts(torch.nn.Module):
    """A block named in --deepspeed_moe_layer_cls_names (between ordinary layers, as in a real MoE model)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)


def left_group_at_exit() -> None:
    """Registered before the group exists, so it runs after the exit handler that join_process_group installs."""
    if not dist.is_initialized() and int(os.environ.get("RANK", "0")) == 0:
        print("CHECK launched_left_group_at_exit ok", flush=True)


atexit.register(left_group_at_exit)
expected = json.loads(sys.argv[1])
accelerator = Accelerator()
check("launched_deepspeed", accelerator.distributed_type == "DEEPSPEED" and accelerator.num_processes == 2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), Experts(), torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
features = torch.randn(16, 4)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(features, features @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])),
    batch_size=2,
)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
check(f"launched_stage_{expected['stage']}", model.zero_optimization_stage() == expected["stage"])
engine_config = record_of_engine(model).config
for key, value in expected.get("config", {}).items():
    check(
        f"launched_config_{key}", get_path(engine_config, key) == value, f"({get_path(engine_config, key)!r})"
    )
for name, value in expected.get("plugin", {}).items():
    actual = getattr(accelerator.deepspeed_plugin, name)
    check(f"launched_plugin_{name}", actual == value, f"({actual!r})")
if "moe_leaf" in expected:
    from deepspeed.utils import z3_leaf_module

    leaves = [module for module in model.module.modules() if type(module).__name__ == expected["moe_leaf"]]
    check("launched_moe_leaf", bool(leaves) and all(z3_leaf_module(module) for module in leaves))


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
    check("launched_by_deepspeed_runner", True)  # and no end_training(): the exit handler leaves the group
else:
    accelerator.end_training()
