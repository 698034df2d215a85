"""Accelerate's type aliases in ``accelerate.utils.dataclasses`` (served at ``drivetrain.utils.dataclasses``):
the options of the precision and profiling configurations, as ``typing.Literal`` types whose values are listed in
:data:`drivetrain.compat.paths.ACCELERATE_LITERALS`."""

from __future__ import annotations

from typing import Any, Literal

from drivetrain.compat import paths


def __getattr__(name: str) -> Any:
    if name in paths.ACCELERATE_LITERALS:
        return Literal[paths.ACCELERATE_LITERALS[name]]  # type: ignore[valid-type]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
