"""Contract 1.1's flat names of ``drivetrain.plugin_api``, kept importable for plugins written for 1.1.

Contract 1.2 keeps the names nearly every plugin needs at the top of ``drivetrain.plugin_api`` and groups
the other helpers in namespaces. A 1.1 plugin's ``from drivetrain.plugin_api import safe_load`` still works
and warns once per name, naming the new place; contract 2.0 drops the flat names.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: 1.1 flat name -> the namespace of ``drivetrain.plugin_api`` that holds it in 1.2 (same name there).
MOVED: dict[str, str] = {
    **dict.fromkeys(
        ["backend_settings", "plugin_options", "to_bool", "KwargsHandler"],
        "settings",
    ),
    **dict.fromkeys(
        [
            "AcceleratorState",
            "PartialState",
            "initialized_accelerator_state",
            "reset_state",
            "register_rng_type",
        ],
        "state",
    ),
    **dict.fromkeys(
        [
            "AcceleratedOptimizer",
            "AcceleratedScheduler",
            "patch_forward_with_autocast",
            "track_step_for_schedulers",
            "rebind_scheduler",
        ],
        "training",
    ),
    **dict.fromkeys(["prepare_data_loader", "send_to_device", "find_device"], "data"),
    **dict.fromkeys(
        [
            "write_training_objects",
            "read_training_objects",
            "write_model_weights",
            "torch_save_into_checkpoint",
            "writes_shared_files",
            "model_file_name",
            "optimizer_file_name",
            "scheduler_file_name",
            "safe_load",
            "safe_dcp_load",
            "read_dcp_metadata",
            "write_model_files",
        ],
        "checkpoint",
    ),
    **dict.fromkeys(
        [
            "TensorRecord",
            "can_map",
            "map_tensor",
            "populate",
            "read_header",
            "INDEX_FILE",
            "load_offload_index",
            "save_offload_index",
            "write_offloaded_weights",
            "device_for",
            "find_tied_parameters",
            "normalize_device",
            "CustomDtype",
            "init_empty_weights",
            "infer_auto_device_map",
            "resolve_device_map",
            "load_checkpoint_in_model",
            "dispatch_model",
            "set_module_tensor_to_device",
            "offload_weight",
        ],
        "big_model",
    ),
    **dict.fromkeys(["GeneralTracker", "on_main_process"], "tracking"),
    **dict.fromkeys(
        [
            "Accelerator",
            "HOOK_SPECS",
            "check_requirements",
            "get_plugin_manager",
            "hook_implementations",
        ],
        "tooling",
    ),
}

#: 1.1 flat names that contract 1.2 leaves out (no plugin used them) -> (kernel module, name there, what to
#: use instead). They still import as 1.1 names, with the advice in the warning; contract 2.0 drops them.
REMOVED: dict[str, tuple[str, str, str]] = {
    "GradientState": (
        "drivetrain.state",
        "GradientState",
        "read accelerator.gradient_state or accelerator.sync_gradients in a hook",
    ),
    "HOOK_STYLES": (
        "drivetrain.contract.hookspecs",
        "HOOK_STYLES",
        "docs/hooks.md says how each hook is called",
    ),
    "resolve_setting": (
        "drivetrain.config.sources",
        "resolve",
        "read a plugin's settings with plugin_api.settings.plugin_options or backend_settings",
    ),
    "to_int": (
        "drivetrain.config.sources",
        "to_int",
        "use int() and raise ConfigurationError naming the setting",
    ),
}

NAMESPACES = frozenset(MOVED.values())


def moved_name(name: str, namespace: dict[str, Any]) -> Any:
    """``drivetrain.plugin_api.<name>`` for a name not in ``namespace`` (its globals): a namespace (imported
    now), or a 1.1 flat name (with a DeprecationWarning naming its 1.2 place, then kept in ``namespace``),
    else an AttributeError saying where the names are."""
    if name in NAMESPACES:
        return importlib.import_module(f"drivetrain.plugin_api.{name}")
    if name in REMOVED:
        module, attribute, advice = REMOVED[name]
        warnings.warn(
            f"drivetrain.plugin_api.{name} is a contract 1.1 name that contract 1.2 leaves out: {advice} "
            "(it goes in 2.0, see docs/plugins/versioning.md)",
            DeprecationWarning,
            stacklevel=3,
        )
        value = getattr(importlib.import_module(module), attribute)
        namespace[name] = value
        return value
    place = MOVED.get(name)
    if place is None:
        raise AttributeError(
            f"drivetrain.plugin_api has no {name!r}: plugins import only what it declares "
            "(see docs/plugins/api.md); ask for what you need in an issue"
        )
    warnings.warn(
        f"drivetrain.plugin_api.{name} is a contract 1.1 name: import it from drivetrain.plugin_api.{place} "
        f"(contract 1.2; the flat name goes in 2.0, see docs/plugins/versioning.md)",
        DeprecationWarning,
        stacklevel=3,
    )
    value = getattr(importlib.import_module(f"drivetrain.plugin_api.{place}"), name)
    namespace[name] = value  # warned once: later reads find it
    return value
