"""Dataclass fields whose values are checked, and normalised, on every assignment: in ``__init__`` and after
(``config.total_limit = 0`` fails as ``ProjectConfiguration(total_limit=0)`` does).

The configuration objects are stdlib dataclasses, as Accelerate's are, so ``dataclasses.fields``, ``asdict``
and ``replace`` work on them and importing drivetrain costs no third-party class library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: ``check(instance, field_name, value)`` returns the value to store, or raises ConfigurationError naming the
#: class, the field and what is valid.
Check = Callable[[Any, str, Any], Any]


def checked(default: T, check: Check) -> T:
    """A field with a default whose every assigned value goes through ``check`` (see :class:`Checked`)."""
    return dataclasses.field(default=default, metadata={"check": check})


class Checked:
    """Base of the dataclasses with :func:`checked` fields."""

    def __setattr__(self, name: str, value: Any) -> None:
        field = getattr(type(self), "__dataclass_fields__", {}).get(name)
        if field is not None and "check" in field.metadata:
            value = field.metadata["check"](self, name, value)
        object.__setattr__(self, name, value)
