"""Breaks autocast: mixed_precision="bf16" computes in float16."""

import torch

from drivetrain import hookimpl
from drivetrain.contract.info import Capabilities, PluginInfo

PLUGIN_INFO = PluginInfo(kind="backend", capabilities=Capabilities(precisions=("no", "bf16")))


@hookimpl
def autocast(accelerator, autocast_kwargs):
    if accelerator.mixed_precision == "bf16":
        return torch.autocast(device_type="cpu", dtype=torch.float16, **autocast_kwargs)
    return None
