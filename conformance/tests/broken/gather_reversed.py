"""Breaks collectives: all_gather returns the ranks' tensors in reverse order."""

from drivetrain import hookimpl
from drivetrain.plugin_api import TorchCollectives, join_process_group
from drivetrain_ddp.plugin import PLUGIN_INFO, wrap_model  # noqa: F401


class ReversedGather(TorchCollectives):
    def all_gather(self, tensor):
        return list(reversed(super().all_gather(tensor)))


@hookimpl
def setup_process_group(device, init_kwargs):
    environment = join_process_group(device, init_kwargs)
    if environment.num_processes > 1:
        environment.collectives = ReversedGather()
    return environment
