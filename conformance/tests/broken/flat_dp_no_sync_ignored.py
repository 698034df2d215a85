"""flat-dp, broken: the wrapper's no_sync() does nothing, so every backward averages (caught by no_sync)."""

import contextlib

from flat_dp import FlatDataParallel, backward, declaring, setup_process_group  # noqa: F401

from drivetrain import hookimpl

PLUGIN_INFO = declaring("no")  # fewer precisions, fewer runs: the mistake shows in this one


class AlwaysSyncing(FlatDataParallel):
    def no_sync(self):
        return contextlib.nullcontext()  # the mistake


@hookimpl
def wrap_model(model, accelerator, evaluation_mode):
    if evaluation_mode or accelerator.num_processes == 1:
        return None
    return AlwaysSyncing(model)
