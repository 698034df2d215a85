"""Every DDP communication hook type trains (loss goes down, replicas stay equal), run in N processes by
test_ddp_multiprocess.py. Prints ``CHECK <name> ok`` per passed check."""

from __future__ import annotations

import torch
import torch.distributed as dist

from drivetrain import Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs

HOOK_NAMES = {
    "fp16": "fp16_compress_hook",
    "bf16": "bf16_compress_hook",
    "power_sgd": "powerSGD_hook",
    "batched_power_sgd": "batched_powerSGD_hook",
}


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        raise AssertionError(f"check {name} failed on rank {dist.get_rank()}: {detail}")
    if dist.get_rank() == 0:
        print(f"CHECK {name} ok", flush=True)


def train(handler: DistributedDataParallelKwargs) -> tuple[torch.nn.Module, float, float]:
    accelerator = Accelerator(kwargs_handlers=[handler])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    model = accelerator.prepare(model)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.05))
    generator = torch.Generator().manual_seed(100 + accelerator.process_index)
    inputs = torch.randn(64, 8, generator=generator)
    targets = inputs @ torch.linspace(-1, 1, 32).reshape(8, 4)
    losses = []
    for step in range(40):
        rows = slice((step % 8) * 8, (step % 8 + 1) * 8)
        loss = torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    return model, sum(losses[:8]) / 8, sum(losses[-8:]) / 8


def replicas_equal(model: torch.nn.Module) -> bool:
    for parameter in model.parameters():
        copies = [torch.empty_like(parameter) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, parameter.detach())
        if not all(torch.equal(parameter, other) for other in copies):
            return False
    return True


def main() -> None:
    torch.set_num_threads(1)
    Accelerator()  # joins the process group
    bf16_hook = "bf16_compress_hook" if dist.get_backend() == "nccl" else "bf16_compress_any_backend"
    cases = [
        (
            "fp16",
            DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16),
            "fp16_compress_hook",
        ),
        ("bf16", DistributedDataParallelKwargs(comm_hook="bf16"), bf16_hook),
        (
            "power_sgd_bf16_wrapper",
            DistributedDataParallelKwargs(
                comm_hook="power_sgd",
                comm_wrapper="bf16",
                comm_state_option={"start_powerSGD_iter": 2},
            ),
            "bf16_wrapped_hook" if bf16_hook.endswith("backend") else "bf16_compress_wrapper_hook",
        ),
        (
            "power_sgd",
            DistributedDataParallelKwargs(
                comm_hook=DDPCommunicationHookType.POWER_SGD,
                comm_state_option={
                    "matrix_approximation_rank": 2,
                    "start_powerSGD_iter": 2,
                    "min_compression_rate": 0.5,
                },
            ),
            "powerSGD_hook",
        ),
        (
            "batched_power_sgd",
            DistributedDataParallelKwargs(
                comm_hook=DDPCommunicationHookType.BATCHED_POWER_SGD,
                comm_state_option={"matrix_approximation_rank": 2, "start_powerSGD_iter": 2},
            ),
            "batched_powerSGD_hook",
        ),
        (
            "power_sgd_fp16_wrapper",
            DistributedDataParallelKwargs(
                comm_hook=DDPCommunicationHookType.POWER_SGD,
                comm_wrapper=DDPCommunicationHookType.FP16,
                comm_state_option={"start_powerSGD_iter": 2},
            ),
            "fp16_compress_wrapper_hook",
        ),
    ]
    for name, handler, hook_name in cases:
        model, first, last = train(handler)
        registered = model._get_ddp_logging_data().get("comm_hook", "")
        check(f"{name}_registered", hook_name in registered, f"registered hook {registered!r}")
        check(f"{name}_loss_decreases", last < 0.5 * first, f"loss {first:.4f} -> {last:.4f}")
        check(f"{name}_replicas_equal", replicas_equal(model))
        hooks = getattr(model, "_comm_hooks", [])
        state = hooks[0][1] if hooks else None
        if name in ("power_sgd", "batched_power_sgd"):
            check(
                f"{name}_state_option",
                state is not None and state.matrix_approximation_rank == 2,
                repr(state),
            )
    Accelerator().end_training()


if __name__ == "__main__":
    main()
