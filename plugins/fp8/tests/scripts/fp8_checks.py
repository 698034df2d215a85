"""fp8 (torchao) under a multi-process backend, run in 2 real processes by test_fp8_multiprocess.py.

Usage: ``fp8_checks.py ddp|fsdp CHECKPOINT_DIR``. Every rank also trains the one-process reference itself:
the same model converted by hand with torchao, on the whole global batch, under the same bf16 autocast.
Prints ``CHECK <name> ok`` per passed check (after a line with the measured difference); a failure raises.
"""

from __future__ import annotations

import logging
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from drivetrain import Accelerator, FullyShardedDataParallelPlugin
from drivetrain_fp8.ao import convert_model_to_fp8_ao

logging.getLogger("torchao").setLevel(logging.ERROR)

GLOBAL_BATCH = 32
STEPS = 6
#: Largest weight difference allowed between N processes and one. Not zero: torchao scales each tensor by
#: its own absolute maximum, and a process sees only its share of the batch, so activations and gradients
#: are rounded to float8 on a slightly different scale than on one process. Measured 5e-5 with SGD (Adam would
#: turn such differences into lr-sized steps on near-zero gradients) while training moves weights by 2.5e-2.
TOLERANCE = 5e-4


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.GELU(),
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()),
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()),
        torch.nn.Linear(64, 8),
    )


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(STEPS * GLOBAL_BATCH, 16, generator=generator)
    return inputs, torch.sin(inputs[:, :8] * 2)


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = make_data()
    share = GLOBAL_BATCH // world
    start = step * GLOBAL_BATCH + rank * share
    return inputs[start : start + share], targets[start : start + share]


def full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (FSDP's DTensors gathered), as plain tensors, by name without wrapper prefixes."""
    gathered = {}
    for name, parameter in model.named_parameters():
        tensor = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
        tensor = getattr(tensor, "_tensor", tensor)  # torchao's float8 all-gather weight wrapper
        gathered[name.removeprefix("module.")] = tensor.detach().clone()
    return gathered


def max_difference(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
    return max((ours[name] - theirs[name]).abs().max().item() for name in ours)


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        raise AssertionError(f"check {name} failed {detail}")
    if dist.get_rank() == 0:
        if detail:
            print(f"{name}: {detail}", flush=True)
        print(f"CHECK {name} ok", flush=True)


def train(accelerator, model, optimizer, steps: range) -> None:
    for step in steps:
        inputs, targets = batch(step, accelerator.process_index, accelerator.num_processes)
        accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
        optimizer.step()
        optimizer.zero_grad()


def one_process_reference(steps: range) -> torch.nn.Module:
    model = make_model()
    convert_model_to_fp8_ao(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        inputs, targets = batch(step, 0, 1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs = model(inputs)
        torch.nn.functional.mse_loss(outputs.float(), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def prepared(backend: str) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    if backend == "fsdp":
        accelerator = Accelerator(mixed_precision="fp8", fsdp_plugin=FullyShardedDataParallelPlugin())
    else:
        accelerator = Accelerator(mixed_precision="fp8")
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def check_ddp() -> None:
    accelerator, model, optimizer = prepared("ddp")
    inner = model.module
    check(
        "fp8_then_ddp",
        isinstance(model, torch.nn.parallel.DistributedDataParallel)
        and [type(inner[i][0]).__name__ for i in (2, 3)] == ["Float8Linear", "Float8Linear"]
        and type(inner[0]).__name__ == "Linear",
    )
    train(accelerator, model, optimizer, range(STEPS))
    ours = full(model)
    others = [torch.empty_like(ours["2.0.weight"]) for _ in range(dist.get_world_size())]
    dist.all_gather(others, ours["2.0.weight"])
    check("replicas_equal", all(torch.equal(other, ours["2.0.weight"]) for other in others))
    difference = max_difference(ours, full(one_process_reference(range(STEPS))))
    moved = max_difference(ours, full(make_model()))
    check(
        "ddp_equal_to_one_process",
        difference < TOLERANCE < moved / 20,
        f"(max weight difference {difference:.2e}; weights moved {moved:.2e})",
    )


def check_fsdp(checkpoint_dir: str) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    accelerator, model, optimizer = prepared("fsdp")
    layer = model[2][0]
    check(
        "fp8_then_fsdp",
        isinstance(model, FSDPModule)
        and type(layer).__name__ == "Float8Linear"
        and type(model[0]).__name__ == "Linear",
    )
    # FSDP2 all-gathers these weights in float8: each shard is torchao's float8 all-gather tensor
    check("float8_all_gather", isinstance(layer.weight.to_local(), WeightWithDynamicFloat8CastTensor))
    steps_params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    check("optimizer_holds_sharded_weights", steps_params == {id(p) for p in model.parameters()})

    train(accelerator, model, optimizer, range(STEPS // 2))
    accelerator.save_state(checkpoint_dir)
    train(accelerator, model, optimizer, range(STEPS // 2, STEPS))
    ours = full(model)
    difference = max_difference(ours, full(one_process_reference(range(STEPS))))
    moved = max_difference(ours, full(make_model()))
    check(
        "fsdp_equal_to_one_process",
        difference < TOLERANCE < moved / 20,
        f"(max weight difference {difference:.2e}; weights moved {moved:.2e})",
    )

    # the exported weights are an ordinary model's: a plain, unconverted model loads them
    accelerator.save_model(model, checkpoint_dir + "_model")
    accelerator.wait_for_everyone()
    plain = make_model()
    plain.load_state_dict(load_file(checkpoint_dir + "_model/model.safetensors"))
    check("fsdp_save_model_plain", max_difference(full(plain), ours) == 0.0)

    accelerator, model, optimizer = prepared("fsdp")
    accelerator.load_state(checkpoint_dir)
    train(accelerator, model, optimizer, range(STEPS // 2, STEPS))
    check("fsdp_resume_exact", max_difference(full(model), ours) == 0.0)


if __name__ == "__main__":
    if sys.argv[1] == "ddp":
        check_ddp()
    else:
        check_fsdp(sys.argv[2])
