"""Lazy attribute tables, so that ``import drivetrain`` costs little more than ``import torch``."""

from __future__ import annotations

import importlib
from typing import Any


def lazy_getattr(module_name: str, table: dict[str, str], name: str) -> Any:
    """Resolve ``name`` from ``table`` (``name -> "module:attribute"``), else from a plugin's exports."""
    target = table.get(name)
    if target is not None:
        module_path, _, attribute = target.partition(":")
        value = getattr(importlib.import_module(module_path), attribute or name)
        return value
    if name.startswith("__"):
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    from drivetrain.plugins import resolve_export

    try:
        return resolve_export(name)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}") from None
