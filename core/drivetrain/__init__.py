"""drivetrain: run one PyTorch training script on any hardware and distribution backend, through plugins.

Everything here is imported lazily; ``import drivetrain`` imports no plugin and no backend library.
"""

from __future__ import annotations

import os as _os
from typing import Any

from drivetrain.compat import moved as _moved
from drivetrain.compat import paths as _paths
from drivetrain.contract import reexport as _reexport
from drivetrain.contract.hookspecs import CONTRACT_VERSION, hookimpl, hookspec

#: drivetrain's version is the version of Accelerate's API it implements (scripts written for Accelerate gate
#: on ``__version__``); releases of drivetrain's own between two Accelerate releases add a fourth number
#: (1.15.0.1). See docs/migrating.md, "Version gates".
__version__ = "1.15.0"
#: The Accelerate release whose public API (names, signatures, behaviour) this drivetrain implements.
__accelerate_api__ = "1.15.0"

_moved.install()  # contract 1.0's module paths still import, with a warning naming the new one
_reexport.install()  # Accelerate's module paths with no file here (drivetrain.hooks, ...) are made from tables

if _os.environ.get("DRIVETRAIN_LAUNCH_CHANNEL"):
    # A process of `drivetrain launch`: its uncaught error goes to the launcher, and is printed only when it
    # is the job's first (failure_report.py), from the moment drivetrain is imported.
    from drivetrain import failure_report as _failure_report

    _failure_report.install_from_environment()

_EXPORTS = {
    "Accelerator": "drivetrain.accelerator",
    "PartialState": "drivetrain.state",
    "AcceleratorState": "drivetrain.state",
    "GradientState": "drivetrain.state",
    "reset_state": "drivetrain.state",
    "DistributedType": "drivetrain.config.enums",
    "PrecisionType": "drivetrain.config.enums",
    "DataLoaderConfiguration": "drivetrain.config.dataclasses",
    "ProjectConfiguration": "drivetrain.config.dataclasses",
    "GradientAccumulationPlugin": "drivetrain.config.dataclasses",
    "TorchDynamoPlugin": "drivetrain.config.dataclasses",
    "ParallelismConfig": "drivetrain.config.parallelism",
    "AutocastKwargs": "drivetrain.config.kwargs_handlers",
    "GradScalerKwargs": "drivetrain.config.kwargs_handlers",
    "InitProcessGroupKwargs": "drivetrain.config.kwargs_handlers",
    "ProfileKwargs": "drivetrain.config.kwargs_handlers",
    "find_executable_batch_size": "drivetrain.operations.memory",
    "synchronize_rng_states": "drivetrain.operations.random",
    "skip_first_batches": "drivetrain.data",
    "notebook_launcher": "drivetrain.launching.forked",
    "debug_launcher": "drivetrain.launching.forked",
    "init_empty_weights": "drivetrain.big_modeling",
    "init_on_device": "drivetrain.big_modeling",
    "dispatch_model": "drivetrain.big_modeling",
    "load_checkpoint_and_dispatch": "drivetrain.big_modeling",
    "infer_auto_device_map": "drivetrain.big_modeling",
    "load_checkpoint_in_model": "drivetrain.big_modeling",
    "get_logger": "drivetrain.logging",
    "is_rich_available": "drivetrain.compat.accelerate_api.availability_checks",
}

_getattr, _dir, _names = _reexport.reexport(__name__, _EXPORTS)
__all__ = ["CONTRACT_VERSION", "__accelerate_api__", "__version__", "hookimpl", "hookspec", *_names]


def __getattr__(name: str) -> Any:
    if name == "rich":  # Accelerate's ``accelerate.rich``: importing it installs rich's traceback handler
        import importlib

        return importlib.import_module("drivetrain.utils.rich")
    if (
        f"{__name__}.{name}" in _paths.GENERATED_MODULES
    ):  # drivetrain.hooks, ... as attributes, as in Accelerate
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    return _getattr(name)


def __dir__() -> list[str]:
    return sorted(__all__)
