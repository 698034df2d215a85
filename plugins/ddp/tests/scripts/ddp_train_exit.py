"""A complete small DDP training run that ends the way user scripts do (``end_training()`` and nothing
else); the process group is torn down by the ddp plugin's exit handler. Used by the exit stress test."""

import torch

from drivetrain import Accelerator


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = torch.utils.data.TensorDataset(torch.randn(128, 16), torch.randn(128, 2))
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for inputs, targets in loader:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main()
