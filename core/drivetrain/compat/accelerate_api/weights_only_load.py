"""Accelerate's ``load`` (``accelerate.utils.other``, served at ``drivetrain.utils.other``): ``torch.load`` with
torch's weights-only unpickler, which also allows the numpy arrays and RNG states of Accelerate's checkpoints.
numpy is imported only when asked for (``np_core``, ``TORCH_SAFE_GLOBALS``)."""

from __future__ import annotations

from typing import Any

import torch


def _numpy_core() -> Any:
    import numpy

    return numpy._core if hasattr(numpy, "_core") else numpy.core


def _safe_globals() -> list[Any]:
    """What a checkpoint of RNG states and numpy arrays needs beyond torch's weights-only allowlist."""
    from codecs import encode

    import numpy

    found: list[Any] = [_numpy_core().multiarray._reconstruct, numpy.ndarray, encode, numpy.dtype]
    uint32 = getattr(getattr(numpy, "dtypes", None), "UInt32DType", None)
    if uint32 is not None:
        found.append(uint32)
    return found


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` unless asked otherwise, numpy arrays and RNG states allowed;
    torch's allowlist is as before afterwards."""
    kwargs.setdefault("weights_only", True)
    previous = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals(_safe_globals())
    try:
        return torch.load(f, map_location=map_location, **kwargs)
    finally:
        torch.serialization.clear_safe_globals()
        if previous:
            torch.serialization.add_safe_globals(previous)


def _lazy(name: str) -> Any:
    if name == "np_core":
        return _numpy_core()
    if name == "TORCH_SAFE_GLOBALS":
        return _safe_globals()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    value = _lazy(name)
    globals()[name] = value  # made once: a constant is the same object at every read
    return value
