"""How many bytes a model's tensors take, and how much memory each device offers.

Everything here works on a model whose weights are on the meta device: sizes come from shapes and dtypes.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import torch

from drivetrain.config.enums import CustomDtype
from drivetrain.units import parse_size

#: Bytes per element of the weights that are no torch dtype (quantized weights, sized for device maps); the
#: members in order: the 8-bit float, int4, int2.
CUSTOM_DTYPE_BYTES = dict(zip(CustomDtype, (1.0, 0.5, 0.25), strict=True))


def to_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """Accept ``torch.float16``, ``"float16"`` or ``"torch.float16"``."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use a torch dtype such as torch.float16 or 'bfloat16'")
    return value


def _size_dtype(dtype: torch.dtype | CustomDtype | str | None) -> torch.dtype | CustomDtype | None:
    """A dtype to size weights with: a torch dtype (see :func:`to_dtype`) or a ``CustomDtype`` (``INT4`` for
    4-bit quantized weights)."""
    return dtype if isinstance(dtype, CustomDtype) else to_dtype(dtype)


def dtype_byte_size(dtype: torch.dtype | CustomDtype) -> float:
    """Bytes per element (``torch.bool`` counts 1/8: checkpoints store it packed in our size estimates)."""
    if isinstance(dtype, CustomDtype):
        return CUSTOM_DTYPE_BYTES[dtype]
    if dtype == torch.bool:
        return 1 / 8
    return torch.empty((), dtype=dtype).element_size()


def tensor_size(tensor: torch.Tensor, dtype: torch.dtype | CustomDtype | None = None) -> int:
    """Bytes ``tensor`` takes once cast to ``dtype``; only floating tensors are cast, and never up."""
    size = dtype_byte_size(tensor.dtype)
    if dtype is not None and tensor.is_floating_point():
        size = min(size, dtype_byte_size(dtype))
    return int(tensor.numel() * size)


def named_module_tensors(
    module: torch.nn.Module, include_buffers: bool = True, recurse: bool = False
) -> list[tuple[str, torch.Tensor]]:
    """Parameters then buffers of ``module``, each shared tensor once."""
    tensors: list[tuple[str, torch.Tensor]] = list(module.named_parameters(recurse=recurse))
    if include_buffers:
        tensors += list(module.named_buffers(recurse=recurse))
    return tensors


def compute_module_sizes(
    model: torch.nn.Module,
    dtype: torch.dtype | CustomDtype | str | None = None,
    special_dtypes: dict[str, torch.dtype | str] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every module and tensor of ``model``, by dotted name; ``""`` is the whole model.

    A tied tensor is counted once, under its first name. ``dtype`` is the dtype floating weights will be
    loaded in; ``special_dtypes`` overrides it for some tensors (by full name).
    """
    dtype = _size_dtype(dtype)
    special = {name: _size_dtype(value) for name, value in (special_dtypes or {}).items()}
    sizes: dict[str, int] = defaultdict(int)
    tensors = list(model.named_buffers()) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        size = tensor_size(tensor, special.get(name, dtype))
        parts = name.split(".")
        for index in range(len(parts) + 1):
            sizes[".".join(parts[:index])] += size
    return sizes


def _available_cpu_memory() -> int:
    """MemAvailable from /proc/meminfo (what the kernel could give without swapping), else total RAM."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _is_device_type(name: str) -> bool:
    """Whether torch knows ``name`` as a device type here (``"mps"``, ``"xpu"``, one a device plugin added)."""
    try:
        return torch.device(name).index is None
    except (RuntimeError, ValueError):
        return False


def _device_key(key: Any) -> int | str:
    """``"0"`` and ``0`` both mean CUDA device 0; ``"cuda:1"`` means 1; ``"cpu"``, ``"disk"`` and other device
    types torch knows (an accelerator with one device) stay."""
    if isinstance(key, torch.device):
        key = key.index if key.type == "cuda" else key.type
    if isinstance(key, str):
        if key.isdigit():
            return int(key)
        if key.startswith("cuda:") and key[5:].isdigit():
            return int(key[5:])
        if key == "disk" or (key != "cuda" and _is_device_type(key)):
            return key
        raise ValueError(
            f"unknown device {key!r} in max_memory; use GPU indices (0, 1, ...), 'cpu', 'disk' or a device "
            "type torch knows here"
        )
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    raise ValueError(f"unknown device {key!r} in max_memory; use GPU indices (0, 1, ...), 'cpu' or 'disk'")


def _device_order(key: int | str) -> tuple[int, int]:
    # Fastest first: GPUs by index, then other accelerators, then RAM, then disk.
    if isinstance(key, int):
        return (0, key)
    return ({"cpu": 2, "disk": 3}.get(key, 1), 0)


def get_max_memory(max_memory: dict[Any, int | str] | None = None) -> dict[int | str, int]:
    """Bytes usable per device, fastest device first.

    Without ``max_memory``: the free memory of every visible CUDA device and the available RAM. With it:
    the same keys, sizes parsed (``"10GiB"``), ``"0"`` read as GPU 0. As in Accelerate, the sizes given as
    text are also converted in the caller's dict (its keys stay): transformers reads them back as numbers.
    """
    if max_memory is None:
        found: dict[int | str, int] = {}
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                found[index] = torch.cuda.mem_get_info(index)[0]
        else:
            accelerator = getattr(torch, "accelerator", None)
            current = accelerator.current_accelerator() if accelerator is not None else None
            if current is not None:
                # One other accelerator (Apple's shares the RAM): as much as the RAM has free.
                found[current.type] = _available_cpu_memory()
        found["cpu"] = _available_cpu_memory()
        return found
    parsed = {_device_key(key): parse_size(value) for key, value in max_memory.items()}
    for key, value in max_memory.items():
        if isinstance(value, str):
            max_memory[key] = parse_size(value)
    return dict(sorted(parsed.items(), key=lambda item: _device_order(item[0])))


def largest_leaf_size(
    model: torch.nn.Module, sizes: dict[str, int], no_split_module_classes: list[str] | None = None
) -> int:
    """Bytes of the biggest block that is never split: a leaf module or a ``no_split_module_classes`` one."""
    no_split = set(no_split_module_classes or [])
    biggest = 0
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:
        name, module = stack.pop()
        children = list(module.named_children())
        if not children or type(module).__name__ in no_split:
            biggest = max(biggest, sizes.get(name, 0))
            continue
        stack.extend((f"{name}.{child}" if name else child, sub) for child, sub in children)
    return biggest


def get_balanced_memory(
    model: torch.nn.Module,
    max_memory: dict[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: torch.dtype | CustomDtype | str | None = None,
    special_dtypes: dict[str, torch.dtype | str] | None = None,
    low_zero: bool = False,
) -> dict[int | str, int]:
    """A ``max_memory`` that spreads the model evenly over the GPUs instead of filling the first ones.

    With ``low_zero`` GPU 0 only gets what the other GPUs cannot hold (keep it free for ``generate``).
    Does nothing with fewer than two GPUs, or when the model does not fit on the GPUs anyway.
    """
    memory = get_max_memory(max_memory)
    gpus = [key for key in memory if isinstance(key, int) and memory[key] > 0]
    if len(gpus) < 2 or (low_zero and len(gpus) < 2):
        return memory
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    total = sizes[""]
    if total > sum(memory[gpu] for gpu in gpus):
        return memory
    shares = len(gpus) - 1 if low_zero else len(gpus)
    # Headroom of one unsplittable block per GPU: blocks rarely cut the model into equal parts.
    per_gpu = total // shares + largest_leaf_size(model, sizes, no_split_module_classes)
    balanced = dict(memory)
    for gpu in gpus:
        balanced[gpu] = min(per_gpu, memory[gpu])
    if low_zero:
        others = sum(balanced[gpu] for gpu in gpus[1:])
        balanced[gpus[0]] = min(max(0, total - others), memory[gpus[0]])
    return balanced
