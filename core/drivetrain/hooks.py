"""``drivetrain.hooks``: Accelerate's ``accelerate.hooks`` names, for scripts that import them from there.

These are **module hooks** (functions run around a module's forward, used for offloading), not plugin hooks
(see ``drivetrain.contract.hookspecs``). They live in the offload plugin; importing one without ``drivetrain-offload``
installed raises an ImportError naming it.
"""

from __future__ import annotations

from typing import Any

from drivetrain.compat.names import MODULE_HOOK_NAMES as _MODULE_HOOK_NAMES

__all__ = list(_MODULE_HOOK_NAMES)  # resolved lazily below


def __getattr__(name: str) -> Any:
    from drivetrain.contract.exports import lazy_getattr

    if name not in _MODULE_HOOK_NAMES:
        raise AttributeError(f"module 'drivetrain.hooks' has no attribute {name!r}")
    return lazy_getattr(__name__, {}, name)
