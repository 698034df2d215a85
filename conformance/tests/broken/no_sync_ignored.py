"""Breaks no_sync: the wrapped model's no_sync() does nothing, so gradients are averaged every backward."""

import contextlib

from drivetrain import hookimpl
from drivetrain.plugin_api import release_at_shutdown
from drivetrain_ddp.plugin import PLUGIN_INFO, setup_process_group  # noqa: F401
from drivetrain_ddp.wrapper import DrivetrainDDP


class AlwaysSyncing(DrivetrainDDP):
    def no_sync(self):
        return contextlib.nullcontext()


@hookimpl
def wrap_model(model, accelerator, evaluation_mode):
    if evaluation_mode or accelerator.num_processes <= 1:
        return None
    return release_at_shutdown(AlwaysSyncing(model))
