"""Breaks checkpoint_resume: load_state reports success without restoring anything."""

from drivetrain import hookimpl
from drivetrain.backends.local import PLUGIN_INFO  # noqa: F401


@hookimpl
def load_state(input_dir, accelerator, models, optimizers, schedulers, map_location):
    return True
