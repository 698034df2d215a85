"""A script for `drivetrain launch --tpu` (plugins/xla/tests): one step, then what it ran on."""

import sys

import torch

from drivetrain import Accelerator


def main():
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = model(torch.ones(4, 2, device=accelerator.device)).sum()
    accelerator.backward(loss)
    optimizer.step()
    print(
        "RESULT",
        accelerator.backend_plugin,
        accelerator.device,
        accelerator.mixed_precision,
        sys.argv[1:],
        flush=True,
    )


if __name__ == "__main__":
    print("as __main__")
    main()
