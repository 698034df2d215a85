"""Check 3 (one process under torch.distributed.run): FSDP2 (fully_shard) on the GPU trains, matches the hand
loop within 1e-5, and save_state/load_state resumes exactly."""

from __future__ import annotations

import functools
import sys
import tempfile

import torch
from common import device_or_exit, max_difference, prepared_task, run_checks, train_on, train_plain

from drivetrain import Accelerator
from drivetrain.utils import FullyShardedDataParallelPlugin

STEPS = 12


def main() -> int:
    device = device_or_exit("fsdp")
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    model, optimizer, loader = prepared_task(accelerator)
    batches = list(loader)
    run = functools.partial(train_on, accelerator, model, optimizer)

    def full_weights():
        state = accelerator.get_state_dict(model)
        return {k: v.detach().float().cpu().clone() for k, v in state.items()}

    def trains():
        run(batches[:STEPS])
        diff = max_difference(full_weights(), train_plain(device, STEPS))
        sharded = type(next(model.parameters())).__name__
        return (
            diff < 1e-5,
            diff,
            (
                f"max |fsdp2 - hand loop| after {STEPS} SGD steps (pass < 1e-5); parameter type={sharded}, "
                f"device={accelerator.device}, distributed_type={accelerator.distributed_type}, "
                f"process group={torch.distributed.get_backend() if torch.distributed.is_initialized() else 'none'}"
            ),
        )

    def resumes():
        with tempfile.TemporaryDirectory() as directory:
            accelerator.save_state(directory)
            run(batches[:5])
            first = full_weights()
            run(batches[5:8])
            accelerator.load_state(directory)
            run(batches[:5])
            diff = max_difference(first, full_weights())
        return diff == 0.0, diff, "max |continued - resumed| after 5 steps (pass: 0)"

    code = run_checks([("fsdp2_trains_matches_local", trains), ("fsdp2_save_load_resume", resumes)])
    accelerator.end_training()
    return code


if __name__ == "__main__":
    sys.exit(main())
