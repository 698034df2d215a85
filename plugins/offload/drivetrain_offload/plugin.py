"""The ``offload`` plugin: runs models whose weights are spread over devices, CPU RAM and disk."""

from __future__ import annotations

from typing import Any

from drivetrain import hookimpl
from drivetrain.plugin_api import PluginInfo

PLUGIN_INFO = PluginInfo(
    kind="feature",
    description="big model inference: device maps across GPUs, CPU and disk offload, prefetch",
)


@hookimpl
def dispatch_module(
    model: Any,
    device_map: dict[str, Any],
    main_device: Any,
    offload_dir: str | None,
    state_dict: dict | None,
    options: dict[str, Any],
) -> Any:
    from drivetrain_offload.dispatch import dispatch

    return dispatch(model, device_map, main_device, offload_dir, state_dict, options)
