"""flat-dp, broken: the wrapper never broadcasts process 0's weights, so processes seeded differently train
different models (caught by prepare_synchronises_weights only: every other property starts all processes
from the same weights)."""

import torch
from flat_dp import FlatDataParallel, backward, declaring, setup_process_group  # noqa: F401

from drivetrain import hookimpl

PLUGIN_INFO = declaring("no")  # fewer precisions, fewer runs: the mistake shows in this one


class Unbroadcast(FlatDataParallel):
    def __init__(self, module: torch.nn.Module) -> None:
        torch.nn.Module.__init__(self)  # the mistake: FlatDataParallel.__init__'s broadcast is skipped
        self.module = module
        self.require_sync = True


@hookimpl
def wrap_model(model, accelerator, evaluation_mode):
    if evaluation_mode or accelerator.num_processes == 1:
        return None
    return Unbroadcast(model)
