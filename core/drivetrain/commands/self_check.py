"""The script ``drivetrain test`` launches: checks that the processes find each other, that collectives
give the right answers, and (when the Accelerator is available) that a prepared model trains to the same
weights everywhere. Prints one line per check on the main process; exits non-zero on the first failure."""

from __future__ import annotations

import os

import torch

from drivetrain.state import PartialState


def check(condition: bool, message: str) -> None:
    if not condition:
        raise SystemExit(f"self-check failed on process {os.environ.get('RANK', '0')}: {message}")


def check_processes(state: PartialState) -> None:
    expected = int(os.environ.get("WORLD_SIZE", "1"))
    check(
        state.num_processes == expected,
        f"{state.num_processes} processes joined, the launcher started {expected}",
    )
    total = torch.tensor([float(state.process_index)])
    state.collectives.all_reduce(total, "sum")
    want = sum(range(state.num_processes))
    check(total.item() == want, f"all_reduce(sum) of ranks gave {total.item()}, expected {want}")
    gathered = state.collectives.all_gather_object(state.process_index)
    check(list(gathered) == list(range(state.num_processes)), f"all_gather_object gave {gathered}")
    message = ["hello from the main process" if state.is_main_process else None]
    state.collectives.broadcast_object_list(message, 0)
    check(message[0] == "hello from the main process", f"broadcast_object_list gave {message[0]!r}")


def check_training(state: PartialState) -> str:
    try:
        from drivetrain.accelerator import Accelerator
    except ImportError:
        return "training skipped (drivetrain.accelerator is not available)"
    torch.manual_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    # Each process trains on its own slice: equal weights afterwards prove that gradients were synchronised.
    generator = torch.Generator().manual_seed(1 + state.process_index)
    for _ in range(8):
        inputs, targets = torch.randn(4, 4, generator=generator), torch.randn(4, 1, generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(
            model(inputs.to(accelerator.device)), targets.to(accelerator.device)
        )
        accelerator.backward(loss)
        optimizer.step()
    weights = accelerator.unwrap_model(model).weight.detach().cpu().clone()
    everyone = state.collectives.all_gather(weights)
    check(
        all(torch.equal(weights, other) for other in everyone),
        "weights differ between processes after training",
    )
    return f"training on {accelerator.device} ({accelerator.mixed_precision} precision) gave equal weights"


def main() -> None:
    state = PartialState()
    check_processes(state)
    training = check_training(state)
    if state.is_main_process:
        print(
            f"drivetrain self-check: {state.num_processes} process(es), backend {state.backend_name}, "
            f"device {state.device}: processes and collectives ok; {training}",
            flush=True,
        )
    state.destroy_process_group()


if __name__ == "__main__":
    main()
