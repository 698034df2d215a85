"""The ipex plugin's hooks: Intel XPU device detection, oneCCL/xccl process groups, ipex.optimize.

A device plugin is active whenever it is installed, so every hook here is a no-op unless its hardware is
present (the XPU) or the run asked for IPEX (``settings.request``): installing the plugin changes nothing
by itself. As a device plugin it runs first in the wrap_model chain, so ipex converts the model before a
backend (ddp) wraps it.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, PluginAccelerator, PluginInfo, environment_world_size
from drivetrain_ipex import optimize, settings, xpu

PLUGIN_INFO = PluginInfo(
    kind="device",
    description=(
        "Intel Extension for PyTorch: ipex.optimize of model and optimizer when asked "
        "(plugins=['ipex'], --ipex, ipex_config), and Intel XPUs through torch's xpu device"
    ),
    optional_requires={
        "intel_extension_for_pytorch": "ipex.optimize (IPEX 2.8.0 with torch 2.8; end-of-life upstream)",
        "oneccl_bindings_for_pytorch": "the oneCCL process-group backend (InitProcessGroupKwargs(backend='ccl'))",
    },
    capabilities=Capabilities(multi_process=True, precisions=("no", "bf16", "fp16"), devices=("cpu", "xpu")),
)


@hookimpl
def register_extensions(registry: Any) -> None:
    registry.add_launch_options(settings.add_launch_options)
    registry.add_config_keys(
        {settings.CONFIG_SECTION: settings.check_section, "use_xpu": settings.check_flag}
    )


@hookimpl
def detect_device(local_process_index: int, cpu: bool) -> torch.device | None:
    return xpu.detect_device(local_process_index, cpu, settings.process_request())


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> None:
    # Never answers: the backend (ddp) joins the group; this only makes ccl/xccl usable or says why not.
    xpu.check_process_group(device, init_kwargs, environment_world_size())


@hookimpl
def wrap_model(model: torch.nn.Module, accelerator: PluginAccelerator) -> torch.nn.Module | None:
    # evaluation_mode is not needed: what ipex does follows the module's own mode and its optimizer
    request = settings.request(accelerator)
    if not optimize.wants_ipex(request):
        return None
    return optimize.wrap_model(model, accelerator, request)


@hookimpl
def wrap_optimizer(optimizer: Any, accelerator: PluginAccelerator) -> None:
    request = settings.request(accelerator)
    if optimize.wants_ipex(request):
        optimize.wrap_optimizer(optimizer, accelerator, request)
