"""drivetrain-offload: big model inference for drivetrain (module hooks, CPU and disk offload, prefetch).

Everything public is also importable from ``drivetrain`` and ``drivetrain.big_modeling``. Names resolve on
first use, so loading the plugin (``drivetrain plugins``, ``drivetrain launch``) imports none of them.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "attach_align_device_hook": "attach",
    "attach_align_device_hook_on_blocks": "attach",
    "attach_execution_device_hook": "attach",
    "AlignDevicesHook": "module_hooks",
    "ModelHook": "module_hooks",
    "SequentialHook": "module_hooks",
    "UserCpuOffloadHook": "module_hooks",
    "add_hook_to_module": "module_hooks",
    "remove_hook_from_module": "module_hooks",
    "remove_hook_from_submodules": "module_hooks",
    "cpu_offload": "offload",
    "cpu_offload_with_hook": "offload",
    "disk_offload": "offload",
    "OffloadedWeights": "weights",
    "align_module_device": "inspection",
    "has_offloaded_params": "inspection",
    "LayerwiseCastingHook": "layerwise_casting",
    "attach_layerwise_casting_hooks": "layerwise_casting",
    "CpuOffload": "module_hooks",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'drivetrain_offload' has no attribute {name!r}")
    return getattr(importlib.import_module(f"drivetrain_offload.{_WHERE[name]}"), name)
