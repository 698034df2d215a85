"""Training checks on torch_xla's CPU device, one mode per process (the XLA runtime, SPMD included, is set
once per process). Writes a JSON result for plugins/xla/tests; run by conftest.run_check.

    python xla_checks.py MODE RESULT.json WORKDIR        MODE: one | spmd | torchrun | replicas

Every training check trains the same 4-16-2 MLP (SGD lr 0.1, batches of 8) with drivetrain's reference
backend ``local`` on the CPU and with the xla backend, and reports the largest weight difference. The XLA
runs come first: torch's autograd engine sizes its per-device queues at the first backward pass of a process,
from the devices known then, so an XLA backward after a CPU one that preceded the XLA runtime fails.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import drivetrain
from drivetrain import Accelerator

STEPS = 6
BATCH = 8


def data(samples: int = STEPS * BATCH) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(samples, 4, generator=generator)
    targets = torch.randn(samples, 2, generator=generator)
    return torch.utils.data.TensorDataset(inputs, targets)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def weights(net: torch.nn.Module, accelerator: Accelerator) -> dict[str, torch.Tensor]:
    return {
        name: value.detach().cpu().float().clone() for name, value in accelerator.get_state_dict(net).items()
    }


def max_difference(first: dict, second: dict) -> float:
    assert first.keys() == second.keys(), (sorted(first), sorted(second))
    return max(float((first[key] - second[key]).abs().max()) for key in first)


def compile_count() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def train(
    accelerator: Accelerator,
    steps: int = STEPS,
    seed: int = 0,
    save_at: int | None = None,
    save_dir: str | None = None,
    resume_from: str | None = None,
    accumulation: int = 1,
) -> tuple[dict, list[float], list[int]]:
    net = model(seed)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(data(steps * BATCH * accumulation), batch_size=BATCH)
    net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    if resume_from is not None:
        accelerator.load_state(resume_from)
    losses, compiles = [], []
    xla = accelerator.device.type == "xla"
    for index, (inputs, targets) in enumerate(loader, start=1):
        with accelerator.accumulate(net):
            loss = torch.nn.functional.mse_loss(net(inputs).float(), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(float(loss.detach().cpu()))
        if xla:
            compiles.append(compile_count())
        if save_at is not None and index == save_at:
            accelerator.save_state(save_dir)
    return weights(net, accelerator), losses, compiles


def reference(**kwargs) -> tuple[dict, list[float]]:
    """The same training with the reference backend on the CPU (cpu=True: the XLA device is not used)."""
    drivetrain.reset_state()
    accelerator = Accelerator(cpu=True, backend="local", **kwargs)
    trained, losses, _ = train(accelerator, accumulation=accelerator.gradient_accumulation_steps)
    drivetrain.reset_state()
    return trained, losses


def one_device(workdir: str) -> dict:
    from drivetrain.utils import is_torch_xla_available

    result: dict = {
        "available": is_torch_xla_available(),
        "is_tpu": is_torch_xla_available(check_is_tpu=True),
    }
    accelerator = Accelerator()
    result["backend"] = accelerator.backend_plugin
    result["backend_source"] = accelerator.state.backend_source
    result["device"] = str(accelerator.device)
    result["distributed_type"] = accelerator.distributed_type.value
    checkpoint = os.path.join(workdir, "checkpoint")
    trained, losses, compiles = train(accelerator, save_at=3, save_dir=checkpoint)
    net = accelerator.prepared.models[0]
    accelerator.save_model(net, os.path.join(workdir, "saved"))
    gathered = accelerator.gather(torch.arange(3, device=accelerator.device))
    result["gather"] = gathered.cpu().tolist()
    result["reduce"] = float(accelerator.reduce(torch.tensor(2.0, device=accelerator.device)).cpu())
    local_weights, local_losses = reference()
    result["max_weight_difference"] = max_difference(trained, local_weights)
    result["max_loss_difference"] = max(abs(a - b) for a, b in zip(losses, local_losses))
    result["compiles_per_step"] = compiles
    result["checkpoint_files"] = sorted(os.listdir(checkpoint))

    # save_model wrote CPU tensors (safetensors) equal to the trained weights
    from safetensors.torch import load_file

    saved = load_file(os.path.join(workdir, "saved", "model.safetensors"))
    result["save_model_difference"] = max_difference(saved, trained)

    # resume: a new run loads the step-3 checkpoint (weights, optimizer, loader position) and finishes
    drivetrain.reset_state()
    resumed = Accelerator()
    resumed_weights, resumed_losses, _ = train(resumed, seed=99, resume_from=checkpoint)
    result["resumed_batches"] = len(resumed_losses)
    result["resume_difference"] = max_difference(resumed_weights, trained)
    result["resumed_losses_match"] = resumed_losses == losses[3:]

    # weight tying survives the move to the device
    drivetrain.reset_state()
    accelerator = Accelerator()

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    tied = accelerator.prepare(Tied())
    result["tied_after_prepare"] = tied.head.weight is tied.embed.weight
    result["tied_device"] = str(tied.head.weight.device)

    # bf16 autocast on the XLA device, against the reference backend's bf16 on the CPU
    drivetrain.reset_state()
    accelerator = Accelerator(mixed_precision="bf16")
    bf16_weights, _, _ = train(accelerator)
    bf16_local, _ = reference(mixed_precision="bf16")
    result["bf16_difference"] = max_difference(bf16_weights, bf16_local)
    result["bf16_vs_fp32"] = max_difference(bf16_weights, local_weights)

    # gradient accumulation (2 micro-steps per step), against the reference backend
    accelerator = Accelerator(gradient_accumulation_steps=2)
    accumulated, _, accumulation_compiles = train(accelerator, accumulation=2)
    accumulated_local, _ = reference(gradient_accumulation_steps=2)
    result["accumulation_difference"] = max_difference(accumulated, accumulated_local)
    result["accumulation_compiles"] = accumulation_compiles
    return result


def spmd(workdir: str) -> dict:
    import torch_xla
    import torch_xla.runtime as xr

    from drivetrain.utils import XlaConfig

    result: dict = {}
    accelerator = Accelerator(backend_config=XlaConfig(spmd=True))
    result["is_spmd"] = bool(xr.is_spmd())
    result["devices"] = int(xr.global_runtime_device_count())
    result["num_processes"] = accelerator.num_processes
    trained, _, compiles = train(accelerator, save_at=3, save_dir=os.path.join(workdir, "spmd_checkpoint"))
    # how a prepared loader's batch lies on the devices (after the save: a checkpoint holds every loader)
    inputs, targets = next(iter(accelerator.prepare(torch.utils.data.DataLoader(data(), batch_size=BATCH))))
    result["input_sharding"] = torch_xla._XLAC._get_xla_sharding_spec(inputs)
    labels = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(16), batch_size=BATCH))
    result["label_sharding"] = torch_xla._XLAC._get_xla_sharding_spec(next(iter(labels)))
    local_weights, _ = reference()
    result["max_weight_difference"] = max_difference(trained, local_weights)
    result["compiles_per_step"] = compiles

    drivetrain.reset_state()
    resumed = Accelerator(backend_config=XlaConfig(spmd=True))
    resumed_weights, _, _ = train(resumed, seed=99, resume_from=os.path.join(workdir, "spmd_checkpoint"))
    result["resume_difference"] = max_difference(resumed_weights, trained)

    drivetrain.reset_state()
    accelerator = Accelerator(backend_config=XlaConfig(fsdp=True))
    fsdp_weights, _, fsdp_compiles = train(accelerator)
    result["fsdp_difference"] = max_difference(fsdp_weights, local_weights)
    result["fsdp_compiles_per_step"] = fsdp_compiles
    net = accelerator.prepared.models[0]
    first = next(iter(net.parameters()))
    result["fsdp_parameter_sharding"] = torch_xla._XLAC._get_xla_sharding_spec(first)
    return result


def torchrun_refused(workdir: str) -> dict:
    # What torchrun sets for the second of two processes: each would be an XLA world of its own.
    # (backend named: with ddp installed the automatic choice for 2 processes is ddp, which the XLA device
    # then replaces by xla; this env has no ddp)
    os.environ.update(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    try:
        Accelerator(backend="xla")
    except Exception as exc:  # the refusal is the result
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}


def _replica(index: int, path: str) -> None:
    import torch_xla
    import torch_xla.core.xla_model as xm

    value = torch.tensor([float(index + 1)], device=torch_xla.device())
    total = xm.all_reduce(xm.REDUCE_SUM, value)
    torch_xla.sync()
    with open(f"{path}.{index}", "w") as handle:
        handle.write(str(float(total.cpu())))


def replicas(workdir: str) -> dict:
    import torch_xla

    path = os.path.join(workdir, "replica")
    torch_xla.launch(_replica, args=(path,))
    return {"sums": [float(open(f"{path}.{index}").read()) for index in range(2)]}


if __name__ == "__main__":
    mode, result_path, work = sys.argv[1:4]
    checks = {"one": one_device, "spmd": spmd, "torchrun": torchrun_refused, "replicas": replicas}
    outcome = checks[mode](work)
    with open(result_path, "w") as out:
        json.dump(outcome, out, indent=1, default=str)
