"""Peak host memory per rank while the fsdp backend prepares a model, with and without
``cpu_ram_efficient_loading``.

Two processes (gloo, CPU) prepare a stack of linear layers of about ``--params`` million parameters (fp32)
with FULL_SHARD. Without RAM-efficient loading every rank builds the whole model, then keeps its shard;
with it only rank 0 builds the weights, the other ranks build the model on the meta device and receive
their shard by broadcast. The figure per rank is the growth of its peak resident set size
(``ru_maxrss``) from just before the model is built to after ``prepare``.

    python bench/fsdp_memory.py [--params 100]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile

import torch

LAYER_WIDTH = 1024


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def build(million_params: int) -> torch.nn.Module:
    layers = max(1, round(million_params * 1e6 / (LAYER_WIDTH * LAYER_WIDTH)))
    return torch.nn.Sequential(*[torch.nn.Linear(LAYER_WIDTH, LAYER_WIDTH) for _ in range(layers)])


def worker(ram_efficient: bool, million_params: int, output: str) -> None:
    from drivetrain import Accelerator, FullyShardedDataParallelPlugin

    torch.set_num_threads(1)
    plugin = FullyShardedDataParallelPlugin(
        cpu_ram_efficient_loading=ram_efficient,
        auto_wrap_policy="SIZE_BASED_WRAP",
        min_num_params=LAYER_WIDTH * LAYER_WIDTH,
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    before = peak_rss_mib()
    if ram_efficient and not accelerator.is_main_process:
        with torch.device("meta"):
            model = build(million_params)
    else:
        model = build(million_params)
    model = accelerator.prepare(model)
    growth = peak_rss_mib() - before
    local = sum(p.to_local().numel() for p in model.parameters()) * 4 / 2**20
    results = accelerator.state.collectives.all_gather_object(
        {"rank": accelerator.process_index, "peak_growth_mib": round(growth, 1), "shard_mib": round(local, 1)}
    )
    if accelerator.is_main_process:
        with open(output, "w") as handle:
            json.dump(results, handle)
    accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=100, help="model size in millions of parameters")
    parser.add_argument("--worker", choices=["plain", "ram_efficient"], help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker == "ram_efficient", args.params, args.output)
        return

    from drivetrain.testing import launch_script

    model_mib = args.params * 1e6 * 4 / 2**20
    print(f"model: ~{args.params}M parameters (~{model_mib:.0f} MiB fp32), 2 processes, FULL_SHARD")
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("plain", "ram_efficient"):
            output = os.path.join(folder, f"{mode}.json")
            launch_script(
                os.path.abspath(__file__),
                num_processes=2,
                args=["--worker", mode, "--params", str(args.params), "--output", output],
                env={"TMPDIR": folder},
            )
            with open(output) as handle:
                for row in json.load(handle):
                    print(
                        f"{mode:>14}  rank {row['rank']}: peak host memory growth {row['peak_growth_mib']:8.1f} MiB"
                        f"  (its shard: {row['shard_mib']:.1f} MiB)"
                    )


if __name__ == "__main__":
    sys.exit(main())
