"""drivetrain-offload: big model inference for drivetrain (module hooks, CPU and disk offload, prefetch).

Everything public is also importable from ``drivetrain`` and ``drivetrain.big_modeling``.
"""

from drivetrain_offload.attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
)
from drivetrain_offload.module_hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from drivetrain_offload.offload import cpu_offload, cpu_offload_with_hook, disk_offload
from drivetrain_offload.weights import OffloadedWeights, align_module_device, has_offloaded_params

__all__ = [
    "AlignDevicesHook",
    "ModelHook",
    "OffloadedWeights",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "align_module_device",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "has_offloaded_params",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]
