"""Check 2 (launched with `drivetrain launch --num_processes 1` or torch.distributed.run): the ddp backend on
one GPU (nccl; gloo on a CPU dry run) trains like a hand-written loop, and gather_for_metrics returns exactly
the dataset's rows (no duplicates from padding)."""

from __future__ import annotations

import itertools
import sys

import torch
from common import against_hand_loop, device_or_exit, prepared_task, run_checks, train_on

from drivetrain import Accelerator

STEPS = 12


def main() -> int:
    device = device_or_exit("ddp")
    accelerator = Accelerator()
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"
    backend_name = accelerator.state.backend  # the torch.distributed backend drivetrain chose (nccl on CUDA)

    def trains():
        model, optimizer, loader = prepared_task(accelerator)
        wrapped = type(model).__name__
        train_on(accelerator, model, optimizer, itertools.islice(loader, STEPS))
        ours = {k: v.detach().float().cpu() for k, v in accelerator.unwrap_model(model).state_dict().items()}
        diff, before, after = against_hand_loop(ours, device, STEPS)
        ok = diff < 1e-5 and after < before and device.type == accelerator.device.type
        # with one process the backend may leave the model unwrapped; the line says what it did
        return (
            ok,
            diff,
            (
                f"max |ddp - hand loop| after {STEPS} SGD steps (pass < 1e-5); dataset loss {before:.4f} -> "
                f"{after:.4f}; model={wrapped}, process group={backend}, "
                f"device={accelerator.device}, distributed_type={accelerator.distributed_type}, backend={backend_name}"
            ),
        )

    def gathers():
        rows = 203  # not a multiple of the batch size: the last batch is short
        data = torch.utils.data.TensorDataset(torch.arange(rows, dtype=torch.float32))
        loader = accelerator.prepare(torch.utils.data.DataLoader(data, batch_size=16))
        seen = torch.cat([accelerator.gather_for_metrics(batch[0]) for batch in loader])
        ok = seen.numel() == rows and sorted(seen.long().tolist()) == list(range(rows))
        return ok, seen.numel(), f"rows gathered (pass: exactly {rows}, each once)"

    code = run_checks([("ddp_launch_1proc_trains", trains), ("ddp_gather_for_metrics_exact", gathers)])
    accelerator.end_training()
    return code


if __name__ == "__main__":
    sys.exit(main())
