"""Sizes written by people: ``"10GiB"``, ``"500MB"``, or a number of bytes."""

from __future__ import annotations

import re
from typing import Any

# Decimal units are powers of 1000, binary units ("GiB") powers of 1024, as in every disk and RAM spec.
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(size: Any, what: str = "memory size", allow_zero: bool = True) -> int:
    """Bytes in ``size``: an int (or float) of bytes, or a number with a unit — ``"10GiB"`` ->
    10737418240, ``"500MB"`` -> 500000000. Raises ValueError naming ``what``, the value and the units."""
    value: float | None = None
    if isinstance(size, (int, float)) and not isinstance(size, bool):
        value = size
    elif isinstance(size, str):
        match = _SIZE_PATTERN.match(size)
        if match and match.group(2).upper() in _UNITS:
            value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value is None or value < 0 or (value == 0 and not allow_zero):
        smallest = "a non-negative" if allow_zero else "a positive"
        raise ValueError(
            f"{what}={size!r} is not a size: give {smallest} number of bytes or a number with one of the units "
            "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. '10GB' or '10GiB'"
        )
    return int(value)
