"""Temporarily changing environment variables (launchers, tests, and a configuration object's defaults taken
without the environment's settings use these). Accelerate's paths for them are ``drivetrain.utils`` and
``drivetrain.utils.environment``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (upper-cased names, str values) for the block, then restore them."""
    previous = {}
    for key, value in kwargs.items():
        name = key.upper()
        previous[name] = os.environ.get(name)
        os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty environment, then restore the original one."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
