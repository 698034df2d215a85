"""Shared by the multi-process step benchmarks (bench/nd_step.py, bench/megatron_step.py): time a prepared
step against the same step written by hand in alternating blocks, inside processes started by
``drivetrain launch``, and collect rank 0's figures. Not a benchmark itself."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from drivetrain.testing import launch_script

Step = Callable[[torch.Tensor, torch.Tensor], None]


def time_block(step: Step, inputs: torch.Tensor, targets: torch.Tensor, steps: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) per step."""
    import torch.distributed as dist

    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for index in range(steps):
        step(inputs[index % len(inputs)], targets[index % len(targets)])
    cpu = time.process_time() - cpu
    dist.barrier()
    return (time.perf_counter() - start) / steps, cpu / steps


def compare(
    raw_step: Step, prepared_step: Step, inputs: torch.Tensor, targets: torch.Tensor, steps: int, rounds: int
) -> dict[str, float]:
    """Warm both up, then ``rounds`` blocks of each, alternating which goes first so that load from other
    programs hits both alike. Medians of wall and CPU time per step, and the fastest block's wall time."""
    for step in (raw_step, prepared_step):  # warm-up
        time_block(step, inputs, targets, max(steps // 3, 5))
    raw, prepared = [], []
    for round_index in range(rounds):
        order = (raw_step, prepared_step) if round_index % 2 == 0 else (prepared_step, raw_step)
        for step in order:
            (raw if step is raw_step else prepared).append(time_block(step, inputs, targets, steps))
    return {
        "raw": statistics.median(wall for wall, _ in raw),
        "prepared": statistics.median(wall for wall, _ in prepared),
        "raw_min": min(wall for wall, _ in raw),
        "prepared_min": min(wall for wall, _ in prepared),
        "raw_cpu": statistics.median(cpu for _, cpu in raw),
        "prepared_cpu": statistics.median(cpu for _, cpu in prepared),
    }


def launch(
    script: str, num_processes: int, steps: int, rounds: int, env: dict[str, str] | None = None
) -> dict:
    """Run ``script --worker`` on ``num_processes`` processes and return what rank 0 wrote (``write_result``)."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        output = os.path.join(tmp, "result.json")
        worker_args = ["--worker", "--steps", str(steps), "--rounds", str(rounds), "--output", output]
        done = launch_script(
            script,
            num_processes,
            args=worker_args,
            env={"TMPDIR": tmp, **(env or {})},
            timeout=3600,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"benchmark run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        with open(output) as handle:
            return json.load(handle)


def write_result(result: dict, output: str) -> None:
    """Rank 0 writes the worker's result for ``launch``."""
    if int(os.environ.get("RANK", "0")) == 0:
        with open(output, "w") as handle:
            json.dump(result, handle)
