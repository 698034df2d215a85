"""Seeding and random-number-generator state: seed every library at once, make every process draw the same
numbers (synchronize_rng_states), and capture / restore every generator for checkpoints.

Device runtimes that torch exposes as ``torch.<name>`` modules with ``get_rng_state``/``set_rng_state``
(cuda, xpu, npu, mlu, hpu) are handled generically. A device plugin whose generator lives elsewhere (XLA)
registers it with :func:`register_rng_type`; the kernel imports no device library.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from drivetrain.config.enums import RNGType

#: rng types that a device plugin registered: name -> (get_state, set_state, seed)
_REGISTERED: dict[
    str, tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], None], Callable[[int], None] | None]
] = {}


def _accelerator_types() -> list[str]:
    """The device type of this machine's accelerator when torch sees one ("cuda", "xpu", ...): set_seed and
    capture_rng_state cover its generators besides the CPU's."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "current_accelerator"):
        current = accelerator.current_accelerator()
        return [current.type] if current is not None else []
    return ["cuda"] if torch.cuda.is_available() else []


def register_rng_type(
    name: str,
    get_state: Callable[[], torch.Tensor],
    set_state: Callable[[torch.Tensor], None],
    seed: Callable[[int], None] | None = None,
) -> None:
    """Teach drivetrain a generator it cannot reach through ``torch.<name>`` (called by device plugins).

    ``get_state`` returns the generator's state as a tensor (the same shape on every process),
    ``set_state`` takes it back; ``seed`` (optional) is called by :func:`set_seed`.
    """
    _REGISTERED[name] = (get_state, set_state, seed)


def _device_module(name: str) -> Any:
    """``torch.<name>`` when that device runtime is present and has a device, else None."""
    module = getattr(torch, name, None)
    is_available = getattr(module, "is_available", None)
    if module is None or is_available is None or not hasattr(module, "get_rng_state"):
        return None
    try:
        return module if is_available() else None
    except Exception:  # a half-installed runtime
        return None


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy, torch (CPU and every device present) and registered generators.

    ``device_specific`` adds the process index, so each process draws different numbers;
    ``deterministic`` makes torch use deterministic algorithms (slower, reproducible).
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"set_seed: seed must be an int, got {type(seed).__name__}")
    if device_specific:
        from drivetrain.state import PartialState

        seed += PartialState().process_index
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy takes 32-bit seeds only
    torch.manual_seed(seed)
    for name in _accelerator_types():
        module = _device_module(name)
        if module is not None and hasattr(module, "manual_seed_all"):
            module.manual_seed_all(seed)
    for _, _, seeder in _REGISTERED.values():
        if seeder is not None:
            seeder(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _rng_accessors(rng_type: str, generator: torch.Generator | None) -> tuple[Callable, Callable]:
    """(get_state, set_state) for one rng type, or a clear error naming what is missing."""
    valid = ", ".join(sorted({*RNGType.list(), *_REGISTERED}))
    if rng_type in _REGISTERED:
        get_state, set_state, _ = _REGISTERED[rng_type]
        return get_state, set_state
    if rng_type not in RNGType.list():
        raise ValueError(f"unknown rng type {rng_type!r}; valid: {valid}")
    if rng_type == RNGType.TORCH:
        return torch.get_rng_state, torch.set_rng_state
    if rng_type == RNGType.GENERATOR:
        if generator is None:
            raise ValueError(
                "rng type 'generator' needs the generator to synchronise: pass generator=<torch.Generator>"
            )
        return generator.get_state, generator.set_state
    module = _device_module(rng_type)
    if module is None:
        raise ValueError(
            f"rng type {rng_type!r} is not available in this process (no such device here, and no device "
            "plugin registered it)"
        )
    return module.get_rng_state, module.set_rng_state


def synchronize_rng_state(
    rng_type: str | RNGType | None = None, generator: torch.Generator | None = None
) -> None:
    """Give every process the state of process 0's generator of kind ``rng_type`` ("torch", "cuda",
    "generator" with ``generator``, ...), so they all draw the same numbers from now on."""
    from drivetrain.operations import broadcast
    from drivetrain.state import PartialState

    rng_type = str(rng_type if rng_type is not None else RNGType.TORCH)
    get_state, set_state = _rng_accessors(rng_type, generator)
    state = PartialState()
    if state.num_processes == 1:
        return
    rng_state = get_state()
    # Generator states are CPU byte tensors; nccl-like backends can only move tensors on the device.
    on_device = broadcast(rng_state.to(state.device), from_process=0, state=state)
    set_state(on_device.to(rng_state.device))


def synchronize_rng_states(
    rng_types: Iterable[str | RNGType] | None = None, generator: torch.Generator | None = None
) -> None:
    """:func:`synchronize_rng_state` for each of ``rng_types`` (default: torch)."""
    for rng_type in rng_types if rng_types is not None else [RNGType.TORCH]:
        synchronize_rng_state(rng_type, generator=generator)


# -- capture / restore (for checkpoints) -------------------------------------------------------------------------
def _numpy_state() -> dict[str, Any]:
    # Tensors and plain values only, so that torch.load(weights_only=True) can read it back.
    legacy: Any = np.random.get_state(legacy=True)
    name, keys, position, has_gauss, cached_gaussian = legacy
    return {
        "bit_generator": str(name),
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(position),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def _restore_numpy_state(saved: dict[str, Any]) -> None:
    np.random.set_state(
        (
            saved["bit_generator"],
            saved["keys"].numpy().astype(np.uint32),
            saved["pos"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )


def capture_rng_state() -> dict[str, Any]:
    """Every generator's state in this process, as a dict of tensors and plain Python values (safe for
    ``torch.save`` and ``torch.load(weights_only=True)``): keys "python", "numpy", "torch", one per
    available device runtime ("cuda", "xpu", ...: a list, one state per device) and one per registered type."""
    captured: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": _numpy_state(),
        "torch": torch.get_rng_state(),
    }
    for name in _accelerator_types():
        module = _device_module(name)
        if module is not None and hasattr(module, "get_rng_state_all"):
            captured[name] = list(module.get_rng_state_all())
    for name, (get_state, _, _) in _REGISTERED.items():
        captured[name] = get_state()
    return captured


def restore_rng_state(saved: dict[str, Any]) -> None:
    """Put back the generator states of :func:`capture_rng_state`. States for a device runtime that is not
    present here (a GPU checkpoint resumed on CPU) are skipped with a warning."""
    if not isinstance(saved, dict):
        raise TypeError(
            f"restore_rng_state needs the dict from capture_rng_state, got {type(saved).__name__}"
        )
    for key, value in saved.items():
        if key == "python":
            version, internal, gauss = value
            random.setstate((version, tuple(internal), gauss))
        elif key == "numpy":
            _restore_numpy_state(value)
        elif key == "torch":
            torch.set_rng_state(value)
        elif key in _REGISTERED:
            _REGISTERED[key][1](value)
        elif isinstance(value, list):  # one state per device of a device runtime ("cuda", ...)
            module = _device_module(key)
            if module is None:
                warnings.warn(
                    f"the saved {key} random state is not restored: no {key} device here", stacklevel=2
                )
                continue
            states = list(value)[: module.device_count()]
            if hasattr(module, "set_rng_state_all"):
                module.set_rng_state_all(states)
            else:
                for index, device_state in enumerate(states):
                    module.set_rng_state(device_state, index)
        else:
            warnings.warn(
                f"the saved random state {key!r} is not restored: nothing here registers it", stacklevel=2
            )
