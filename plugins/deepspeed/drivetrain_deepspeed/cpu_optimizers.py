"""``map_pytorch_optim_to_deepspeed``: DeepSpeed's CPU optimizer that does what a torch optimizer does.

With the optimizer offloaded to the CPU, DeepSpeed steps it on the CPU partitions; its own C++ optimizers
(``DeepSpeedCPUAdam``, ``DeepSpeedCPUAdagrad``, ``DeepSpeedCPULion``) are faster there than torch's. Accelerate
swaps a torch optimizer for one of them automatically; the deepspeed backend keeps the torch optimizer (so
every backend steps the same code, and nothing compiles), and this function is the explicit swap: build the
result *before* ``prepare`` and pass it instead.
"""

from __future__ import annotations

from typing import Any

import torch


def _bitsandbytes_kind(optimizer: Any) -> str | None:
    """ "adamw", "adagrad" or "lion" for a 32-bit bitsandbytes optimizer (the 8-bit ones have no CPU twin)."""
    module = type(optimizer).__module__
    if not module.startswith("bitsandbytes"):
        return None
    bits = getattr(optimizer, "optim_bits", None)
    if bits is None:
        bits = getattr(getattr(optimizer, "args", None), "optim_bits", None)
    if bits != 32:
        return None
    name = type(optimizer).__name__.lower()
    for kind in ("adamw", "adagrad", "lion"):
        if name.startswith(kind):
            return kind
    return None


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> Any:
    """The DeepSpeed CPU optimizer for ``optimizer``'s parameter groups, learning rate and weight decay:
    ``DeepSpeedCPUAdagrad`` for Adagrad, ``DeepSpeedCPULion`` for 32-bit bitsandbytes Lion, otherwise
    ``DeepSpeedCPUAdam`` (decoupled weight decay for ``AdamW``, L2 otherwise). Compiles DeepSpeed's CPU op on
    first use (cached in ``TORCH_EXTENSIONS_DIR``)."""
    defaults = {key: value for key, value in optimizer.defaults.items() if key in ("lr", "weight_decay")}
    kind = _bitsandbytes_kind(optimizer)
    if isinstance(optimizer, torch.optim.Adagrad) or kind == "adagrad":
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    if kind == "lion":
        from deepspeed.ops.lion import DeepSpeedCPULion

        return DeepSpeedCPULion(optimizer.param_groups, **defaults)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    adamw = isinstance(optimizer, torch.optim.AdamW) or kind == "adamw"
    return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=adamw, **defaults)
