"""Accelerate's ``accelerate.utils.versions`` (served at ``drivetrain.utils.versions``): comparing installed versions
against requirements."""

from __future__ import annotations

import functools
import importlib.metadata as importlib_metadata
import operator
from typing import Any

from packaging.version import Version, parse

#: The comparison operators a requirement may use (Accelerate's ``STR_OPERATION_TO_FUNC``).
OPERATIONS = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """Whether ``library_or_version`` (an installed distribution's name, or a parsed Version) stands in
    ``operation`` (``">="``, ``"<"``...) to ``requirement_version``."""
    compare = OPERATIONS.get(operation)
    if compare is None:
        raise ValueError(f"operation must be one of {sorted(OPERATIONS)}, got {operation!r}")
    if isinstance(library_or_version, str):
        library_or_version = parse(importlib_metadata.version(library_or_version))
    return bool(compare(library_or_version, parse(requirement_version)))


@functools.lru_cache(maxsize=1)
def _torch_version() -> Version:
    return parse(importlib_metadata.version("torch"))


def is_torch_version(operation: str, version: str) -> bool:
    """Whether the installed torch stands in ``operation`` to ``version`` (``is_torch_version(">=", "2.4")``)."""
    return compare_versions(_torch_version(), operation, version)


def __getattr__(name: str) -> Any:
    if name == "torch_version":  # read from the installed metadata on first use, not at import
        return _torch_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
