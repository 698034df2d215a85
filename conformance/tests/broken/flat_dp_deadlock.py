"""flat-dp, broken: its own collectives' all_reduce exchanges tensors with the other processes by receiving
before sending, so every process waits in recv for a send nobody makes: a deadlock in accelerator.reduce
(the collectives property), which the suite reports as a hang naming where each process waits, then goes on
with the next property."""

import dataclasses

import torch
import torch.distributed as dist
from flat_dp import backward, declaring, wrap_model  # noqa: F401

from drivetrain import hookimpl
from drivetrain.plugin_api import TorchCollectives, join_process_group

PLUGIN_INFO = declaring("no")  # fewer precisions, fewer runs: the mistake shows in this one


class ReceiveFirst(TorchCollectives):
    def all_reduce(self, tensor, op="sum"):
        if op != "sum":
            return super().all_reduce(tensor, op)
        rank, world = dist.get_rank(), dist.get_world_size()
        total = tensor.clone()
        for other in range(world):
            if other != rank:
                received = torch.empty_like(tensor)
                dist.recv(received, src=other)  # the mistake: every process receives first
                dist.send(tensor, dst=other)
                total += received
        return tensor.copy_(total)


@hookimpl
def setup_process_group(device, init_kwargs):
    environment = join_process_group(device, init_kwargs)
    if environment.num_processes > 1:
        environment = dataclasses.replace(environment, collectives=ReceiveFirst())
    return environment
