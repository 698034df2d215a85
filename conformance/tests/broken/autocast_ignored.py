"""Breaks autocast: mixed precision is accepted but forward passes run in float32."""

import contextlib

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, PluginInfo

PLUGIN_INFO = PluginInfo(kind="backend", capabilities=Capabilities(precisions=("no", "bf16")))


@hookimpl
def autocast(accelerator, autocast_kwargs):
    return contextlib.nullcontext()
