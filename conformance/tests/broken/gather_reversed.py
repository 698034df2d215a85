"""Breaks collectives: all_gather returns the ranks' tensors in reverse order."""

from drivetrain import hookimpl
from drivetrain.operations.torch_collectives import TorchCollectives
from drivetrain_ddp.plugin import PLUGIN_INFO, wrap_model  # noqa: F401
from drivetrain_ddp.process_group import join_process_group


class ReversedGather(TorchCollectives):
    def all_gather(self, tensor):
        return list(reversed(super().all_gather(tensor)))


@hookimpl
def setup_process_group(device, init_kwargs):
    environment = join_process_group(device, init_kwargs)
    if environment.num_processes > 1:
        environment.collectives = ReversedGather()
    return environment
