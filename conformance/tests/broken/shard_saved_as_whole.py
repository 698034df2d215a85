"""Breaks checkpoint_resume: every process saves its optimizer shard under one file name, so on load each
process gets the shard the last writer saved."""

import os

import torch
import torch.distributed as dist
from drivetrain_zero1.plugin import setup_process_group, wrap_model, wrap_optimizer  # noqa: F401

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, PluginInfo
from drivetrain.plugin_api.checkpoint import read_training_objects, write_training_objects

PLUGIN_INFO = PluginInfo(
    kind="backend", capabilities=Capabilities(multi_process=True, sharded_state=True, precisions=("no",))
)


def _zero(optimizers):
    return [getattr(o, "optimizer", o) for o in optimizers]


@hookimpl
def save_state(output_dir, accelerator, weights, optimizers, schedulers, safe_serialization):
    write_training_objects(output_dir, accelerator, weights, [], schedulers, safe_serialization)
    for rank in range(dist.get_world_size()):  # in rank order: the last rank's shard is what stays
        if rank == dist.get_rank():
            for index, zero in enumerate(_zero(optimizers)):
                torch.save(zero.optim.state_dict(), os.path.join(output_dir, f"optimizer-shard-{index}.pt"))
        dist.barrier()
    return True


@hookimpl
def load_state(input_dir, accelerator, models, optimizers, schedulers, map_location, load_kwargs, verified):
    read_training_objects(input_dir, accelerator, models, [], schedulers, map_location, load_kwargs, verified)
    for index, zero in enumerate(_zero(optimizers)):
        zero.optim.load_state_dict(torch.load(os.path.join(input_dir, f"optimizer-shard-{index}.pt")))
    return True
