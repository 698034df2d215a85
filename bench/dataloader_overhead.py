"""Per-batch cost of a prepared data loader against the raw DataLoader it wraps.

One process, CPU, one thread, a TensorDataset of (features, label) read in batches of 8. Each repeat times a
full epoch of the raw loader and of the prepared one (put_on_device=True, as Accelerator.prepare does), in
alternating order, in CPU time of the process; the figure is the ratio of the median per-batch times. Target: <= 1.05.

    python bench/dataloader_overhead.py [--samples 16384] [--repeats 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain.data_loader import prepare_data_loader


def per_batch_seconds(loader: DataLoader) -> float:
    # CPU time of this (single-threaded) process: other jobs on a shared machine do not count.
    start = time.process_time()
    batches = 0
    for _ in loader:
        batches += 1
    return (time.process_time() - start) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 32), torch.randint(0, 10, (args.samples,)))
    raw = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    prepared = prepare_data_loader(DataLoader(data, batch_size=args.batch_size, shuffle=True),
                                   put_on_device=True, device="cpu")
    per_batch_seconds(raw), per_batch_seconds(prepared)  # warm up
    raw_times, prepared_times = [], []
    for repeat in range(args.repeats):
        order = [(raw, raw_times), (prepared, prepared_times)]
        for loader, times in order if repeat % 2 == 0 else order[::-1]:
            times.append(per_batch_seconds(loader))
    raw_median, prepared_median = statistics.median(raw_times), statistics.median(prepared_times)
    print(f"raw DataLoader:      {raw_median * 1e6:8.2f} us/batch")
    print(f"prepared (1 process): {prepared_median * 1e6:8.2f} us/batch")
    print(f"ratio: {prepared_median / raw_median:.3f}  (target <= 1.05; median of {args.repeats} epochs of "
          f"{len(raw)} batches of {args.batch_size})")


if __name__ == "__main__":
    main()
