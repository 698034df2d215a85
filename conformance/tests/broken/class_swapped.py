"""Breaks unwrap_model: the model's class is swapped for a subclass (and never restored)."""

from drivetrain import hookimpl
from drivetrain.backends.local import PLUGIN_INFO  # noqa: F401


@hookimpl
def wrap_model(model):
    model.__class__ = type(f"Fused{type(model).__name__}", (type(model),), {})
    return model
