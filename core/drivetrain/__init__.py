"""drivetrain: run one PyTorch training script on any hardware and distribution backend, through plugins.

Everything here is imported lazily; ``import drivetrain`` imports no plugin and no backend library.
"""

from __future__ import annotations

from typing import Any

from drivetrain.hookspecs import CONTRACT_VERSION, hookimpl, hookspec

__version__ = "0.1.0"

_EXPORTS = {
    "Accelerator": "drivetrain.accelerator",
    "PartialState": "drivetrain.state",
    "AcceleratorState": "drivetrain.state",
    "GradientState": "drivetrain.state",
    "reset_state": "drivetrain.state",
    "DistributedType": "drivetrain.enums",
    "PrecisionType": "drivetrain.enums",
    "DataLoaderConfiguration": "drivetrain.configuration",
    "ProjectConfiguration": "drivetrain.configuration",
    "GradientAccumulationPlugin": "drivetrain.configuration",
    "TorchDynamoPlugin": "drivetrain.configuration",
    "AutocastKwargs": "drivetrain.kwargs_handlers",
    "GradScalerKwargs": "drivetrain.kwargs_handlers",
    "InitProcessGroupKwargs": "drivetrain.kwargs_handlers",
    "ProfileKwargs": "drivetrain.kwargs_handlers",
    "find_executable_batch_size": "drivetrain.memory",
    "synchronize_rng_states": "drivetrain.random",
    "skip_first_batches": "drivetrain.data_loader",
    "notebook_launcher": "drivetrain.launchers",
    "debug_launcher": "drivetrain.launchers",
    "init_empty_weights": "drivetrain.big_modeling",
    "init_on_device": "drivetrain.big_modeling",
    "dispatch_model": "drivetrain.big_modeling",
    "load_checkpoint_and_dispatch": "drivetrain.big_modeling",
    "infer_auto_device_map": "drivetrain.big_modeling",
    "load_checkpoint_in_model": "drivetrain.big_modeling",
    "get_logger": "drivetrain.logging",
}

__all__ = ["CONTRACT_VERSION", "hookimpl", "hookspec", *_EXPORTS]


def __getattr__(name: str) -> Any:
    from drivetrain._lazy import lazy_getattr

    value = lazy_getattr(__name__, {key: f"{module}:{key}" for key, module in _EXPORTS.items()}, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
