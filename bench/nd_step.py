"""Per-step time of an N-D layout prepared by drivetrain against the same layout written in raw PyTorch.

Two layouts on CPU (gloo, one thread per process), an MLP of two blocks (up 128 -> 512, down 512 -> 128):

* tp=2 (2 processes): ``DeviceMesh`` + ``parallelize_module`` (column-wise up, row-wise down) by hand vs
  ``Accelerator(parallelism_config=ParallelismConfig(tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan)))``;
* tp=2 x dp_shard=2 (4 processes): the same plus ``fully_shard`` of each block and the root over the
  ``dp_shard`` dimension by hand vs ``ParallelismConfig(tp_size=2, dp_shard_size=2)`` with the fsdp backend.

Blocks of steps alternate between the two variants, so load from other programs hits both alike. Three
figures per variant: the median over blocks of the per-step wall time, the fastest block (the least disturbed
by other programs on a shared machine), and the median of rank 0's own CPU time per step (what the code
costs, whatever the other programs do). Target: prepared / raw <= 1.05.

    python bench/nd_step.py [--steps 30] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from alternating_steps import compare, launch, write_result  # bench/, the script's folder

HIDDEN = 128
BATCH = 16
PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model() -> Net:
    torch.manual_seed(0)
    return Net()


def raw_layout(dp_shard: int) -> torch.nn.Module:
    """The layout written by hand: the mesh, the tensor-parallel plan, FSDP2 over dp_shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = make_model()
    if dp_shard > 1:
        mesh = init_device_mesh("cpu", (dp_shard, 2), mesh_dim_names=("dp_shard", "tp"))
    else:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    parallelize_module(
        model, mesh["tp"], {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}
    )
    if dp_shard > 1:
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"])
    return model


def worker(steps: int, rounds: int) -> dict[str, float]:
    from drivetrain import Accelerator, FullyShardedDataParallelPlugin
    from drivetrain.parallelism_config import ParallelismConfig
    from drivetrain.utils import TorchTensorParallelConfig

    torch.set_num_threads(1)
    dp_shard = int(os.environ["WORLD_SIZE"]) // 2
    config = ParallelismConfig(
        tp_size=2, dp_shard_size=dp_shard, tp_handler=TorchTensorParallelConfig(tp_plan=PLAN)
    )
    accelerator = Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"]),
        parallelism_config=config,
    )
    raw_model = raw_layout(dp_shard)
    raw_optimizer = torch.optim.SGD(raw_model.parameters(), lr=0.01)
    model = make_model()
    prepared_model, prepared_optimizer = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.01)
    )

    def raw_step(x: torch.Tensor, y: torch.Tensor) -> None:
        torch.nn.functional.mse_loss(raw_model(x), y).backward()
        raw_optimizer.step()
        raw_optimizer.zero_grad()

    def prepared_step(x: torch.Tensor, y: torch.Tensor) -> None:
        accelerator.backward(torch.nn.functional.mse_loss(prepared_model(x), y))
        prepared_optimizer.step()
        prepared_optimizer.zero_grad()

    # The ranks of one tensor-parallel pair take the same batch (what the prepared data loader gives them).
    generator = torch.Generator().manual_seed(accelerator.sharding_options(False).process_index)
    inputs = torch.randn(16, BATCH, HIDDEN, generator=generator)
    targets = torch.randn(16, BATCH, 1, generator=generator)
    result = compare(raw_step, prepared_step, inputs, targets, steps, rounds)
    accelerator.end_training()
    return result


def run(num_processes: int, steps: int, rounds: int) -> dict[str, float]:
    return launch(__file__, num_processes, steps, rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description="prepared vs hand-written N-D layout step time on CPU")
    parser.add_argument("--steps", type=int, default=30, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=9, help="timed blocks per variant")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        write_result(worker(args.steps, args.rounds), args.output)
        return 0
    print(
        f"MLP {HIDDEN}->{4 * HIDDEN}->{HIDDEN} x2, batch {BATCH}, 1 thread, {args.rounds} blocks of {args.steps}"
    )
    for num_processes, label in ((2, "tp=2"), (4, "tp=2 x dp_shard=2")):
        result = run(num_processes, args.steps, args.rounds)
        for suffix, statistic in (("", "median"), ("_min", "fastest"), ("_cpu", "CPU")):
            raw, prepared = result["raw" + suffix], result["prepared" + suffix]
            ratio = prepared / raw
            print(
                f"{label:18s} {statistic:8s} raw {raw * 1e3:7.2f} ms/step   prepared {prepared * 1e3:7.2f} ms/step"
                f"   ratio {ratio:.3f}  {'ok' if ratio <= 1.05 else 'above target 1.05'}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
