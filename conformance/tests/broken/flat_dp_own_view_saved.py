"""flat-dp, broken: save_state has every process write its own view into the checkpoint's shared files (in
rank order, so the last process's view stays). With replicated state the files happen to be right; caught by
checkpoint_per_process_state, which saves while the processes' weights differ."""

import os

import torch
import torch.distributed as dist
from flat_dp import backward, declaring, setup_process_group, wrap_model  # noqa: F401
from safetensors.torch import save_file

from drivetrain import hookimpl

PLUGIN_INFO = declaring("no")  # fewer precisions, fewer runs: the mistake shows in this one


def _name(stem: str, index: int, extension: str) -> str:
    return f"{stem}{'' if index == 0 else f'_{index}'}.{extension}"


@hookimpl
def save_state(output_dir, weights, optimizers, schedulers):
    for rank in range(dist.get_world_size() if dist.is_initialized() else 1):
        if rank == (dist.get_rank() if dist.is_initialized() else 0):  # the mistake: every process writes
            for index, state in enumerate(weights):
                tensors = {key: value.detach().contiguous().cpu() for key, value in state.items()}
                save_file(tensors, os.path.join(output_dir, _name("model", index, "safetensors")))
            for index, optimizer in enumerate(optimizers):
                torch.save(optimizer.state_dict(), os.path.join(output_dir, _name("optimizer", index, "bin")))
            for index, scheduler in enumerate(schedulers):
                torch.save(scheduler.state_dict(), os.path.join(output_dir, _name("scheduler", index, "bin")))
        if dist.is_initialized():
            dist.barrier()
    return True
