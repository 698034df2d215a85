"""Everything a drivetrain plugin may import from the kernel: contract 1.1.

A plugin package imports from the kernel only this module (``from drivetrain import hookimpl`` works too).
In-tree plugins follow the same rule as third parties, and ``tests/test_architecture.py`` enforces it: when a
plugin needs something the kernel has, it is exported here on purpose, documented in docs/plugins/api.md
(generated from this module), and covered by the contract's version. Objects hooks receive are documented
attribute by attribute there; a plugin never reads an underscore attribute of a kernel object.

Names are grouped by what they are for. The light ones (the contract itself) are imported with this module;
the helpers that pull in a kernel service (data loading, checkpoint files, big-model loading, trackers) are
imported on first use, so that importing a plugin module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drivetrain.config.enums import DistributedType, PrecisionType
from drivetrain.config.kwargs_handlers import KwargsHandler
from drivetrain.config.parallelism import ParallelismConfig
from drivetrain.config.sources import resolve as resolve_setting
from drivetrain.config.sources import to_bool, to_int
from drivetrain.contract.arguments import PluginAccelerator, PreparedObjects, ShardingOptions
from drivetrain.contract.environment import Collectives, DistributedEnvironment, environment_world_size
from drivetrain.contract.hookspecs import CONTRACT_VERSION, HOOK_STYLES, hookimpl
from drivetrain.contract.info import Capabilities, ExtensionRegistry, PluginInfo
from drivetrain.contract.manager import (
    HOOK_SPECS,
    check_requirements,
    get_plugin_manager,
    hook_implementations,
)
from drivetrain.contract.selection import backend_settings as _backend_settings
from drivetrain.contract.selection import plugin_options as _plugin_options
from drivetrain.errors import CheckpointError, ConfigurationError, DrivetrainError, PluginError, UsageError

if TYPE_CHECKING:  # pragma: no cover - the lazily imported names, for type checkers
    pass

#: Names imported on first use: name -> module.
_LAZY = {
    # the objects hooks receive
    "Accelerator": "drivetrain.accelerator",
    "AcceleratorState": "drivetrain.state",
    "initialized_accelerator_state": "drivetrain.state",
    "PartialState": "drivetrain.state",
    "GradientState": "drivetrain.state",
    "reset_state": "drivetrain.state",
    "AcceleratedOptimizer": "drivetrain.training.optimizer",
    "AcceleratedScheduler": "drivetrain.training.scheduler",
    # processes and devices
    "TorchCollectives": "drivetrain.operations.torch_collectives",
    "join_process_group": "drivetrain.operations.process_group",
    "release_at_shutdown": "drivetrain.operations.process_group",
    "shutdown_process_group": "drivetrain.operations.process_group",
    "register_rng_type": "drivetrain.operations.random",
    # data
    "prepare_data_loader": "drivetrain.data",
    "send_to_device": "drivetrain.operations",
    "find_device": "drivetrain.operations",
    # the training step
    "patch_forward_with_autocast": "drivetrain.training.modeling",
    "track_step_for_schedulers": "drivetrain.training.scheduler",
    "rebind_scheduler": "drivetrain.training.scheduler",
    # checkpoint files (the reference format, and helpers to write a backend's own files into a checkpoint)
    "write_training_objects": "drivetrain.checkpoint.training_objects",
    "read_training_objects": "drivetrain.checkpoint.training_objects",
    "write_model_weights": "drivetrain.checkpoint.training_objects",
    "torch_save_into_checkpoint": "drivetrain.checkpoint.training_objects",
    "writes_shared_files": "drivetrain.checkpoint.training_objects",
    "model_file_name": "drivetrain.checkpoint.training_objects",
    "optimizer_file_name": "drivetrain.checkpoint.training_objects",
    "scheduler_file_name": "drivetrain.checkpoint.training_objects",
    "read_scheduler_state": "drivetrain.checkpoint.training_objects",
    "checkpoint_path": "drivetrain.checkpoint.manifest",
    "safe_load": "drivetrain.checkpoint.serialization",
    "safe_dcp_load": "drivetrain.checkpoint.dcp_reading",
    "read_dcp_metadata": "drivetrain.checkpoint.dcp_reading",
    "write_model_files": "drivetrain.checkpoint.model_files",
    # big-model loading (for offloading plugins)
    "TensorRecord": "drivetrain.big_modeling.reader",
    "can_map": "drivetrain.big_modeling.reader",
    "map_tensor": "drivetrain.big_modeling.reader",
    "populate": "drivetrain.big_modeling.reader",
    "read_header": "drivetrain.big_modeling.reader",
    "INDEX_FILE": "drivetrain.big_modeling.offload_index",
    "load_offload_index": "drivetrain.big_modeling.offload_index",
    "save_offload_index": "drivetrain.big_modeling.offload_index",
    "write_offloaded_weights": "drivetrain.big_modeling.offload_index",
    "device_for": "drivetrain.big_modeling.device_map",
    "find_tied_parameters": "drivetrain.big_modeling.device_map",
    "normalize_device": "drivetrain.big_modeling.device_map",
    # big-model loading (for quantization plugins: build on meta, size, map, load, place)
    "CustomDtype": "drivetrain.config.enums",
    "init_empty_weights": "drivetrain.big_modeling",
    "infer_auto_device_map": "drivetrain.big_modeling",
    "resolve_device_map": "drivetrain.big_modeling.device_map",
    "load_checkpoint_in_model": "drivetrain.big_modeling",
    "dispatch_model": "drivetrain.big_modeling",
    "set_module_tensor_to_device": "drivetrain.big_modeling.tensors",
    "offload_weight": "drivetrain.big_modeling.memmap_offload",
    # experiment trackers
    "GeneralTracker": "drivetrain.tracking",
    "on_main_process": "drivetrain.tracking",
}

__all__ = [
    # the contract
    "CONTRACT_VERSION",
    "HOOK_SPECS",
    "HOOK_STYLES",
    "hookimpl",
    # declarations
    "Capabilities",
    "ExtensionRegistry",
    "PluginInfo",
    # processes
    "Collectives",
    "DistributedEnvironment",
    "DistributedType",
    "ParallelismConfig",
    "PrecisionType",
    "environment_world_size",
    # what hooks receive
    "PluginAccelerator",
    "PreparedObjects",
    "ShardingOptions",
    # settings
    "KwargsHandler",
    "backend_settings",
    "plugin_options",
    "resolve_setting",
    "to_bool",
    "to_int",
    # errors
    "CheckpointError",
    "ConfigurationError",
    "DrivetrainError",
    "PluginError",
    "UsageError",
    # tooling (conformance, listings)
    "check_requirements",
    "get_plugin_manager",
    "hook_implementations",
    *_LAZY,
]


def backend_settings(backend: str) -> tuple[str | None, dict[str, Any]]:
    """(where they come from, the settings) of backend ``backend`` when the script passed no configuration
    object: what ``drivetrain launch`` handed over (the backend's flags and config-file section), else the
    config file named by ``DRIVETRAIN_CONFIG_FILE`` (Accelerate's ``PluginInfo.config_section`` section, or
    ``backend_config`` when ``backend:`` names the backend). ``(None, {})`` when there are none."""
    return _backend_settings(get_plugin_manager(), backend)


def plugin_options(plugin: str) -> dict[str, Any]:
    """Plugin ``plugin``'s launch options and config-file keys, by name: what ``drivetrain launch`` handed to
    this process, else the keys the plugin claimed (``registry.add_config_keys``) in the config file named by
    ``DRIVETRAIN_CONFIG_FILE``, checked by the plugin. ``{}`` when there are none."""
    return _plugin_options(get_plugin_manager(), plugin)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(
            f"drivetrain.plugin_api has no {name!r}: plugins import only what this module declares "
            "(see docs/plugins/api.md); ask for what you need in an issue"
        )
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
