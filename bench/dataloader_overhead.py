"""Per-batch cost of a prepared data loader against the raw DataLoader it replaces.

CPU, one thread, a TensorDataset of (features, label) read in batches of 8. Two comparisons, each timing full
epochs in alternating order, in CPU time of the process (other jobs on a shared machine do not count):

* one process: the prepared loader (put_on_device=True, as Accelerator.prepare does) vs the raw DataLoader;
* data sharding: the loader prepared for rank 0 of 2 processes vs a raw DataLoader with
  DistributedSampler(num_replicas=2, rank=0) — the same shard, without starting processes.

The figure is the ratio of the median per-batch times. Target (issues 2 and 3): <= 1.05. With
--reference-python, the same comparisons run with accelerate's prepare_data_loader in that interpreter
(a separate virtual environment with accelerate installed).

    python bench/dataloader_overhead.py [--samples 16384] [--repeats 15] [--reference-python /tmp/ref-venv/bin/python]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def per_batch_seconds(loader: DataLoader) -> float:
    start = time.process_time()
    batches = 0
    for _ in loader:
        batches += 1
    return (time.process_time() - start) / batches


def median_ratio(raw: DataLoader, prepared: DataLoader, repeats: int) -> tuple[float, float]:
    per_batch_seconds(raw), per_batch_seconds(prepared)  # warm up
    raw_times, prepared_times = [], []
    for repeat in range(repeats):
        order = [(raw, raw_times), (prepared, prepared_times)]
        for loader, times in order if repeat % 2 == 0 else order[::-1]:
            times.append(per_batch_seconds(loader))
    return statistics.median(raw_times), statistics.median(prepared_times)


def measure(prepare, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 32), torch.randint(0, 10, (args.samples,)))
    results = {}
    raw = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    prepared = prepare(DataLoader(data, batch_size=args.batch_size, shuffle=True), 1, 0)
    results["one process"] = median_ratio(raw, prepared, args.repeats)
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=False)
    raw_shard = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    prepared_shard = prepare(DataLoader(data, batch_size=args.batch_size), 2, 0)
    results["rank 0 of 2"] = median_ratio(raw_shard, prepared_shard, args.repeats)
    return results


def drivetrain_prepare(loader: DataLoader, num_processes: int, process_index: int) -> DataLoader:
    from drivetrain.data_loader import prepare_data_loader

    return prepare_data_loader(
        loader, device="cpu", num_processes=num_processes, process_index=process_index, put_on_device=True
    )


def accelerate_prepare(loader: DataLoader, num_processes: int, process_index: int) -> DataLoader:
    from accelerate.data_loader import prepare_data_loader

    return prepare_data_loader(
        loader,
        device=torch.device("cpu"),
        num_processes=num_processes,
        process_index=process_index,
        put_on_device=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--reference-python", default=None)
    parser.add_argument("--only", choices=["accelerate"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only == "accelerate":
        for name, (raw, prepared) in measure(accelerate_prepare, args).items():
            print(f"{name}\t{prepared / raw:.3f}")
        return
    for name, (raw, prepared) in measure(drivetrain_prepare, args).items():
        print(
            f"{name:12s} raw {raw * 1e6:7.2f} us/batch  prepared {prepared * 1e6:7.2f} us/batch  "
            f"ratio {prepared / raw:.3f} (target <= 1.05)"
        )
    if args.reference_python:
        command = [
            args.reference_python,
            __file__,
            "--only",
            "accelerate",
            "--samples",
            str(args.samples),
            "--batch-size",
            str(args.batch_size),
            "--repeats",
            str(args.repeats),
        ]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        for line in output.strip().splitlines():
            name, ratio = line.split("\t")
            print(f"{name:12s} accelerate ratio {float(ratio):.3f}")


if __name__ == "__main__":
    sys.exit(main())
