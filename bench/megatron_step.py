"""Per-step time of a megatron-core tensor-parallel model prepared by drivetrain against the same model driven
by hand (megatron-core's ``parallel_state`` and the same layers, plain torch optimizer, no drivetrain calls).

tp=2 on 2 CPU processes (gloo, one thread each); an MLP of two blocks of ``ColumnParallelLinear`` (128 -> 512)
and ``RowParallelLinear`` (512 -> 128), SGD, gradient clipping off in both variants. Blocks of steps alternate
between the two variants, so load from other programs hits both alike. Three figures per variant: the median
over blocks of the per-step wall time, the fastest block, and the median of rank 0's own CPU time per step.
Target: prepared / by hand <= 1.05.

    python bench/megatron_step.py [--steps 30] [--rounds 9]
"""

from __future__ import annotations

import argparse
import sys

import torch
from alternating_steps import compare, launch, write_result  # bench/, the script's folder

HIDDEN = 128
BATCH = 16


def make_model(config) -> torch.nn.Module:
    from megatron.core import tensor_parallel

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            init = torch.nn.init.xavier_normal_
            self.up = tensor_parallel.ColumnParallelLinear(
                HIDDEN, 4 * HIDDEN, config=config, init_method=init, bias=True, gather_output=False
            )
            self.down = tensor_parallel.RowParallelLinear(
                4 * HIDDEN,
                HIDDEN,
                config=config,
                init_method=init,
                bias=True,
                input_is_parallel=True,
                skip_bias_add=False,
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hidden, _ = self.up(x)
            out, _ = self.down(torch.relu(hidden))
            return x + out

    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block())


def worker(steps: int, rounds: int) -> dict[str, float]:
    from drivetrain import Accelerator
    from drivetrain.utils import MegatronLMPlugin

    torch.set_num_threads(1)
    plugin = MegatronLMPlugin(tp_degree=2, gradient_clipping=0)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    config = plugin.model_parallel_config()
    # by hand: the groups megatron-core already has, the same layers, a plain optimizer
    raw_model = make_model(config)
    raw_optimizer = torch.optim.SGD(raw_model.parameters(), lr=0.01)
    model = make_model(config)
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

    # Both ranks of the tensor-parallel pair take the same batch (what the prepared data loader gives them).
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(16, BATCH, HIDDEN, generator=generator)
    targets = torch.randn(16, BATCH, HIDDEN, generator=generator)
    result = compare(raw_step, prepared_step, inputs, targets, steps, rounds)
    accelerator.end_training()
    return result


def run(steps: int, rounds: int) -> dict[str, float]:
    return launch(__file__, 2, steps, rounds, env={"PYTHONWARNINGS": "ignore"})


def main() -> int:
    parser = argparse.ArgumentParser(
        description="prepared vs hand-driven megatron-core tp=2 step time on CPU"
    )
    parser.add_argument("--steps", type=int, default=30, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=9, help="timed blocks per variant")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        write_result(worker(args.steps, args.rounds), args.output)
        return 0
    print(
        f"tp=2 MLP {HIDDEN}->{4 * HIDDEN}->{HIDDEN} x2, batch {BATCH}, 1 thread, {args.rounds} blocks of {args.steps}"
    )
    result = run(args.steps, args.rounds)
    for suffix, statistic in (("", "median"), ("_min", "fastest"), ("_cpu", "CPU")):
        raw, prepared = result["raw" + suffix], result["prepared" + suffix]
        ratio = prepared / raw
        print(
            f"tp=2 {statistic:8s} by hand {raw * 1e3:7.2f} ms/step   prepared {prepared * 1e3:7.2f} ms/step"
            f"   ratio {ratio:.3f}  {'ok' if ratio <= 1.05 else 'above target 1.05'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
