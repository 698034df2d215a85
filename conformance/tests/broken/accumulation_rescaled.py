"""Breaks gradient_accumulation: the loss is divided by the accumulation steps a second time."""

from drivetrain import hookimpl
from drivetrain.backends import local
from drivetrain.backends.local import PLUGIN_INFO  # noqa: F401


@hookimpl
def backward(loss, accelerator, backward_kwargs):
    loss = loss / accelerator.gradient_accumulation_steps
    return local.backward(loss=loss, accelerator=accelerator, backward_kwargs=backward_kwargs)
