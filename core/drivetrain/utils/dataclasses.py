"""Accelerate's ``accelerate.utils.dataclasses``: configuration dataclasses, kwargs handlers and enums. They
live in :mod:`drivetrain.config`; backend configurations come from their plugins."""

from __future__ import annotations

from typing import Any, Literal

from drivetrain.contract.reexport import LOGGER, reexport


def _literal(name: str) -> Any:
    """Accelerate's type aliases for options of the precision and profiling configurations."""
    from drivetrain.compat import paths

    return Literal[paths.ACCELERATE_LITERALS[name]]  # type: ignore[valid-type]


def get_module_class_from_name(module: Any, name: str) -> type | None:
    """The class named ``name`` among ``module`` and its submodules (depth first), None if absent."""
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


_CONFIG = "DataLoaderConfiguration GradientAccumulationPlugin ProjectConfiguration TorchDynamoPlugin".split()
_KWARGS = "AutocastKwargs GradScalerKwargs InitProcessGroupKwargs KwargsHandler ProfileKwargs".split()
_ENUMS = (
    "BaseEnum ComputeEnvironment CustomDtype DistributedType DynamoBackend EnumWithContains LoggerType PrecisionType "
    "RNGType SageMakerDistributedType"
).split()
_PARALLEL = "TorchContextParallelConfig TorchTensorParallelConfig TorchTensorParallelPlugin".split()

_reexport_getattr, __dir__, _names = reexport(
    __name__,
    {
        **dict.fromkeys(_CONFIG, "drivetrain.config.dataclasses"),
        **dict.fromkeys(_KWARGS, "drivetrain.config.kwargs_handlers"),
        **dict.fromkeys(_ENUMS, "drivetrain.config.enums"),
        **dict.fromkeys(_PARALLEL, "drivetrain.config.parallelism"),
        "TensorInformation": "drivetrain.operations.nested",
        "logger": LOGGER,
    },
)


def __getattr__(name: str) -> Any:
    from drivetrain.compat import paths

    if name in paths.ACCELERATE_LITERALS:
        return _literal(name)
    return _reexport_getattr(name)


__all__ = sorted({*_names, "get_module_class_from_name"})
