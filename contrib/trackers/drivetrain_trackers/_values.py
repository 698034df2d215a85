"""Small helpers shared by the trackers."""

from __future__ import annotations

import logging
import numbers
from typing import Any

logger = logging.getLogger("drivetrain.tracking")


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


def warn_skipped(tracker: str, skipped: list[str]) -> None:
    if skipped:
        logger.warning(
            "tracker %r cannot log %s: unsupported value type(s); log numbers (or strings where supported)",
            tracker,
            ", ".join(skipped),
        )


def flat_params(values: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts flattened to ``a/b`` keys, for libraries that only store flat parameters."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_params(value, f"{name}/"))
        else:
            flat[name] = value
    return flat
