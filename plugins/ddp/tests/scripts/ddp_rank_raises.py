"""A 2-process DDP job in which one rank raises after a training step while the others go on to the next
collective, as a user's bug on one rank does. Usage: ddp_rank_raises.py FAILING_RANK."""

import sys

import torch

from drivetrain import Accelerator


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.randn(3, 4)).sum())
    optimizer.step()
    if accelerator.process_index == int(sys.argv[1]):
        raise ValueError(f"boom on rank {accelerator.process_index}")
    accelerator.wait_for_everyone()  # waits for the rank that failed


if __name__ == "__main__":
    main()
