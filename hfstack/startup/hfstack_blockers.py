"""The two blockers issue 28 found, worked around in a harness process only, and only while they reproduce.

1. transformers builds ``TorchDynamoPlugin(backend=None, mode=None, ...)``; Accelerate reads ``backend=None`` as
   "the ``ACCELERATE_DYNAMO_BACKEND`` variable, else no"; drivetrain refused it.
2. transformers relies on ``get_max_memory(max_memory)`` converting the caller's dict in place ("300KB" ->
   bytes), as Accelerate's does; drivetrain returned a converted copy.

Each is probed first: once drivetrain behaves as Accelerate does, nothing is patched. What was patched is
printed in the ``HFSTACK_PATCHED`` line of the harness's probe (hfstack/sides.py), and the results say so.
"""

from __future__ import annotations

import functools
import os
import sys

PATCHED: list[str] = []
_done = False


def _dynamo_backend_none_refused() -> bool:
    from drivetrain.utils import TorchDynamoPlugin

    try:
        TorchDynamoPlugin(backend=None, mode=None)
    except Exception:
        return True
    return False


def _patch_dynamo_plugin() -> None:
    from drivetrain.utils import TorchDynamoPlugin

    original_init = TorchDynamoPlugin.__init__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        if "backend" in kwargs and kwargs["backend"] is None:
            kwargs["backend"] = os.environ.get("ACCELERATE_DYNAMO_BACKEND", "no")
        original_init(self, *args, **kwargs)

    TorchDynamoPlugin.__init__ = __init__  # type: ignore[method-assign]
    PATCHED.append("TorchDynamoPlugin(backend=None)")


def _max_memory_copied() -> bool:
    from drivetrain.big_modeling import sizes

    budget = {"cpu": "1KB"}
    sizes.get_max_memory(budget)
    return isinstance(budget["cpu"], str)


def _patch_get_max_memory() -> None:
    from drivetrain.units import parse_size

    original = sys.modules["drivetrain.big_modeling.sizes"].get_max_memory

    @functools.wraps(original)
    def get_max_memory(max_memory=None):
        result = original(max_memory)
        if max_memory is not None:
            for key, value in list(max_memory.items()):
                if isinstance(value, str):
                    max_memory[key] = parse_size(value)
        return result

    for name, module in list(sys.modules.items()):
        if name.startswith("drivetrain") and getattr(module, "get_max_memory", None) is original:
            module.get_max_memory = get_max_memory
    for name in ("drivetrain.utils", "drivetrain.utils.modeling"):
        __import__(name)
        sys.modules[name].get_max_memory = get_max_memory
    PATCHED.append("get_max_memory(in place)")


def apply() -> None:
    """Probe both blockers once per process and patch the ones that reproduce."""
    global _done
    if _done:
        return
    _done = True
    if _dynamo_backend_none_refused():
        _patch_dynamo_plugin()
    if _max_memory_copied():
        _patch_get_max_memory()
