"""What the fsdp worker scripts share: the model, the data, and check reporting.

Step ``k`` of every run trains on rows ``[k*GLOBAL_BATCH, (k+1)*GLOBAL_BATCH)`` of one fixed data set; a
process of ``world`` takes its equal slice, so runs on 1 and 2 processes see the same global batches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

FEATURES = 6
HIDDEN = 10
GLOBAL_BATCH = 16


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, HIDDEN)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(HIDDEN, 1)
        # Not in the state dict: RAM-efficient loading must broadcast it separately.
        self.register_buffer("scale", torch.full((HIDDEN,), 1.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) * self.scale
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def make_model(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    model = Net()
    model.scale.fill_(1.0 + seed / 10)
    return model


def make_data(steps: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(steps * GLOBAL_BATCH, FEATURES, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = make_data()
    per_rank = GLOBAL_BATCH // world
    start = step * GLOBAL_BATCH + rank * per_rank
    return inputs[start : start + per_rank], targets[start : start + per_rank]


def loss_of(model: torch.nn.Module, step: int, rank: int, world: int) -> torch.Tensor:
    inputs, targets = batch(step, rank, world)
    return torch.nn.functional.mse_loss(model(inputs), targets)


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole (DTensors gathered), by name."""
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for name, p in model.named_parameters()
    }


def max_difference(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
    return max((ours[name].float() - theirs[name].float()).abs().max().item() for name in ours)


def train_steps(accelerator, model, optimizer, steps, max_norm: float | None = 0.5) -> None:
    world, rank = accelerator.num_processes, accelerator.process_index
    for step in steps:
        accelerator.backward(loss_of(model, step, rank, world))
        if max_norm is not None:
            accelerator.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad()


def check(name: str, condition: bool, detail: str = "") -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    if not condition:
        raise AssertionError(f"check {name} failed on rank {rank}: {detail}")
    if rank == 0:
        print(f"CHECK {name} ok", flush=True)
