"""Accelerate's small helpers on Python objects (``accelerate.utils.other``, served at ``drivetrain.utils.other``):
an object's qualified name, a dotted attribute path, nested dictionaries merged."""

from __future__ import annotations

import functools
from typing import Any


def get_pretty_name(obj: Any) -> str:
    """The qualified name of ``obj`` (a class or function), else of its class."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """``source`` merged into ``destination`` (nested dictionaries merged key by key); returns ``destination``."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``obj.a.b.c`` for ``attr="a.b.c"``."""
    return functools.reduce(getattr, attr.split("."), obj)
