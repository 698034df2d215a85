"""What the N-D parallelism worker scripts and their test share: the model, its tensor-parallel plan, the
data, the `local` reference run and check reporting.

Step ``k`` trains on rows ``[k*GLOBAL_BATCH, (k+1)*GLOBAL_BATCH)`` of one fixed data set, whatever the layout:
the data-parallel shares of a run split those rows, the ranks of one tensor/context-parallel group see the
same ones. So every layout must end with the weights the `local` backend reaches on one process.
"""

from __future__ import annotations

import torch

FEATURES = 6
HIDDEN = 8
GLOBAL_BATCH = 16
SEQUENCE = 8
STEPS = 6
#: The checkpoint the layouts resume from is saved after this many steps.
SAVE_AFTER = 3
LR = 0.05
MAX_NORM = 0.5
#: Weights within this of the local run's (fp32, AdamW, 6 steps; differences are summation order).
TOLERANCE = 2e-5
#: Megatron-style plan: the first projection of each block split by output rows, the second by input columns.
TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = torch.nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Net(torch.nn.Module):
    """Works token by token on ``(batch, features)`` or ``(batch, sequence, features)`` inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, HIDDEN)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def make_model() -> Net:
    torch.manual_seed(0)
    return Net()


def make_data(sequence: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    shape = (STEPS * GLOBAL_BATCH, SEQUENCE, FEATURES) if sequence else (STEPS * GLOBAL_BATCH, FEATURES)
    inputs = torch.randn(*shape, generator=generator)
    return inputs, inputs.sum(dim=-1, keepdim=True).sin()


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole (DTensors gathered, FSDP1's flat shards summoned), by its name in the user's
    model."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(model):
            return full_parameters(model.module)
    found = {}
    for name, parameter in model.named_parameters():
        tensor = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
        for prefix in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
            name = name.replace(prefix, "")
        found[name] = tensor.detach().clone()
    return found


def max_difference(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
    return max((ours[name].float() - theirs[name].float()).abs().max().item() for name in ours)


def train_local(sequence: bool = False) -> dict[str, object]:
    """The reference: the `local` backend (one process) on whole global batches. Returns the weights after
    SAVE_AFTER and STEPS steps and the clipping norms."""
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="local", cpu=True)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs, targets = make_data(sequence)
    result: dict[str, object] = {"norms": []}
    for step in range(STEPS):
        rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        accelerator.backward(torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows]))
        result["norms"].append(float(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)))
        optimizer.step()
        optimizer.zero_grad()
        if step + 1 == SAVE_AFTER:
            result["after_save"] = full_parameters(model)
    result["final"] = full_parameters(model)
    return result


def check(name: str, condition: bool, detail: str = "") -> None:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    if not condition:
        raise AssertionError(f"check {name} failed on rank {rank}: {detail}")
    if rank == 0:
        print(f"CHECK {name} ok", flush=True)
