"""Deciding where each module of a model lives: checking a hand-made device map and inferring one.

A device map is ``{module or tensor name: device}`` where a device is a GPU index, ``"cpu"``, ``"disk"``
(or ``"mps"``, a ``torch.device``). Every parameter must be covered by exactly one entry (its own name or
the name of a module that contains it); ``""`` covers the whole model.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from drivetrain.big_modeling.sizes import (
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
    named_module_tensors,
)
from drivetrain.config.enums import CustomDtype

logger = logging.getLogger(__name__)

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
OFFLOAD_DEVICES = ("cpu", "disk")


def find_tied_parameters(model: torch.nn.Module) -> list[list[str]]:
    """Groups of parameter names that share one tensor (``[["lm_head.weight", "wte.weight"]]``).

    Identity of the ``Parameter`` objects decides, so it works on the meta device too.
    """
    names_by_id: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names_by_id.setdefault(id(parameter), []).append(name)
    return [sorted(names) for names in names_by_id.values() if len(names) > 1]


def device_for(name: str, device_map: dict[str, Any]) -> Any:
    """The device of tensor or module ``name``: the entry with the longest name that contains it."""
    candidate = name
    while True:
        if candidate in device_map:
            return device_map[candidate]
        if not candidate:
            raise KeyError(name)
        candidate = candidate.rpartition(".")[0]


def check_device_map(model: torch.nn.Module, device_map: dict[str, Any]) -> None:
    """Raise ValueError naming the parameters and buffers that no entry of ``device_map`` covers; warn
    (UserWarning) about entries that name nothing in the model (a typo places nothing)."""
    known = {name for name, _ in model.named_modules()} | {
        name for name, _ in named_module_tensors(model, recurse=True)
    }
    unknown = [key for key in device_map if key not in known]
    if unknown:
        warnings.warn(
            f"device_map keys do not match any submodules, parameters or buffers of the model: {unknown}",
            UserWarning,
            stacklevel=2,
        )
    uncovered = []
    for name, _ in named_module_tensors(model, recurse=True):
        try:
            device_for(name, device_map)
        except KeyError:
            uncovered.append(name)
    if uncovered:
        shown = ", ".join(uncovered[:10]) + (" ..." if len(uncovered) > 10 else "")
        raise ValueError(
            f"the device_map does not cover {len(uncovered)} tensor(s) of the model: {shown}. Add an entry for "
            "each (or for a module that contains it; '' covers the whole model)"
        )


def normalize_device(device: Any) -> int | str:
    """``torch.device("cuda:1")`` -> 1, ``"cuda:0"`` -> 0, ``"cpu"`` -> ``"cpu"``."""
    if isinstance(device, torch.device):
        if device.type == "cuda":
            return device.index or 0
        return str(device)
    if isinstance(device, str) and device.startswith("cuda"):
        return int(device.partition(":")[2] or 0)
    return device


def is_offload(device: Any) -> bool:
    return normalize_device(device) in OFFLOAD_DEVICES


def main_device_of(device_map: dict[str, Any]) -> Any:
    """The device that receives the inputs: the first device that is neither CPU nor disk, else CPU."""
    for device in device_map.values():
        if not is_offload(device):
            return normalize_device(device)
    return "cpu"


def clean_device_map(device_map: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """Merge entries into their parent module when the whole parent sits on one device."""
    order = {name: index for index, (name, _) in enumerate(model.named_modules())}
    for name, _ in named_module_tensors(model, recurse=True):
        order.setdefault(name, len(order))

    def covered_names(prefix: str) -> list[str]:
        return [key for key in device_map if key == prefix or not prefix or key.startswith(prefix + ".")]

    changed = True
    while changed:
        changed = False
        parents = {key.rpartition(".")[0] for key in device_map if key}
        for parent in sorted(parents, key=lambda p: -p.count(".")):
            keys = covered_names(parent)
            devices = {normalize_device(device_map[key]) for key in keys}
            if len(keys) > 1 and len(devices) == 1 and _fully_covered(model, parent, keys):
                device = device_map[keys[0]]
                for key in keys:
                    del device_map[key]
                device_map[parent] = device
                changed = True
                break
    return dict(sorted(device_map.items(), key=lambda item: order.get(item[0], len(order))))


def _fully_covered(model: torch.nn.Module, prefix: str, keys: list[str]) -> bool:
    module = model.get_submodule(prefix) if prefix else model
    for name, _ in named_module_tensors(module, recurse=True):
        full = f"{prefix}.{name}" if prefix else name
        if not any(full == key or full.startswith(key + ".") or not key for key in keys):
            return False
    return True


def infer_auto_device_map(
    model: torch.nn.Module,
    max_memory: dict[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: torch.dtype | CustomDtype | str | None = None,
    special_dtypes: dict[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, int | str]:
    """Place modules on devices in order, fastest device first, filling each up to its ``max_memory``.

    Modules are taken in definition order; one that does not fit is split into its children unless its
    class is in ``no_split_module_classes`` (blocks with residual connections), otherwise it starts the next
    device. Tied parameters are placed together, on the device of the first module that holds one. The
    devices offloaded weights are brought to — the first accelerator, and the CPU — keep room for the
    largest unsplittable block still to be placed (so the map for a budget is the one Accelerate gives).
    The ``"disk"`` device is always available after the others.

    Without ``offload_buffers``, the buffers of modules offloaded to the CPU or disk stay on the execution
    device: a warning says when they fit no accelerator's remaining memory. A device that gets nothing
    because the next block is too big is logged ("insufficient memory"); with ``fallback_allocation`` a
    smaller block that fits is put there first instead.
    """
    memory = get_max_memory(max_memory)
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    device_map = _place(
        model,
        memory,
        sizes,
        no_split_module_classes,
        verbose=verbose,
        offload_buffers=offload_buffers,
        fallback_allocation=fallback_allocation,
    )
    if clean_result:
        device_map = clean_device_map(device_map, model)
    return device_map


def _place(
    model: torch.nn.Module,
    memory: dict[int | str, int],
    sizes: dict[str, int],
    no_split_module_classes: list[str] | None,
    verbose: bool,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, int | str]:
    no_split = set(no_split_module_classes or [])
    devices: list[int | str] = [key for key in memory if key != "disk"] + ["disk"]
    capacity = {key: memory.get(key, 0) for key in devices}
    capacity["disk"] = float("inf")  # type: ignore[assignment]
    accelerators = [key for key in devices if key not in ("cpu", "disk")]
    execution_devices = {accelerators[0], "cpu"} if accelerators else {"cpu"}

    def largest_block(entries: list[tuple[str, Any]]) -> int:
        """The biggest block (a leaf, or a no-split module) among ``entries``: what an execution device
        must still hold room for while offloaded weights visit it."""
        biggest = 0
        stack = [(name, obj) for name, obj in entries if isinstance(obj, torch.nn.Module)]
        while stack:
            name, module = stack.pop()
            children = list(module.named_children())
            if not children or type(module).__name__ in no_split:
                biggest = max(biggest, sizes.get(name, 0))
            else:
                stack.extend((f"{name}.{child}", sub) for child, sub in children)
        return biggest

    tied_groups = find_tied_parameters(model)

    def entries_of(prefix: str, module: torch.nn.Module) -> list[tuple[str, Any]]:
        join = (lambda n: f"{prefix}.{n}") if prefix else (lambda n: n)
        return [(join(n), t) for n, t in named_module_tensors(module)] + [
            (join(n), m) for n, m in module.named_children()
        ]

    queue: list[tuple[str, Any]] = entries_of("", model)
    device_map: dict[str, int | str] = {}
    placed: set[str] = set()
    device_index = 0
    used = 0

    def tensor_names(name: str, obj: Any) -> list[str]:
        if isinstance(obj, torch.nn.Module):
            return [f"{name}.{n}" for n, _ in obj.named_parameters(remove_duplicate=False)]
        return [name]

    used_on: dict[int | str, int] = {}  # bytes taken on each device left behind (with its reserve)
    buffers_on: dict[int | str, int] = {}  # buffer bytes of the modules placed on each device
    unusable: dict[int | str, int] = {}  # devices left empty: what the first block needed there

    while queue:
        name, obj = queue.pop(0)
        if name in placed:
            continue
        # Entries still queued that hold a tensor tied to one of this entry's tensors go with it.
        mine = set(tensor_names(name, obj))
        partner_names = {n for group in tied_groups if mine & set(group) for n in group} - mine
        partners = [
            (qname, qobj)
            for qname, qobj in queue
            if qname not in placed and partner_names & set(tensor_names(qname, qobj))
        ]
        # A partner's tensors tied to this entry's are counted once (they are this entry's).
        size = sizes.get(name, 0) + sum(
            sizes.get(p, 0) - sum(sizes.get(t, 0) for t in tensor_names(p, pobj) if t in partner_names)
            for p, pobj in partners
        )
        reserve = largest_block([entry for entry in queue if entry[0] not in placed])
        fallback = None
        split_partner = None
        while True:
            device = devices[device_index]
            held = reserve if device in execution_devices else 0
            limit = capacity[device] - held
            if used + size <= limit:
                break
            if used + sizes.get(name, 0) <= limit:
                # This entry fits without its tied partners: split a partner so that only its tied part
                # comes along.
                split_partner = next(
                    (
                        (p, pobj)
                        for p, pobj in partners
                        if isinstance(pobj, torch.nn.Module)
                        and list(pobj.children())
                        and type(pobj).__name__ not in no_split
                    ),
                    None,
                )
                if split_partner is not None:
                    break
            splittable = (
                isinstance(obj, torch.nn.Module)
                and list(obj.children())
                and (type(obj).__name__ not in no_split)
            )
            if splittable:
                break
            if used == 0 and fallback_allocation and device != "disk":
                # Rather than leave this device empty, put a smaller block that fits here first.
                room = capacity[device] - max(reserve, size)
                fallback = _fallback_block(queue, placed, sizes, no_split, room, tied_groups, tensor_names)
                if fallback is not None:
                    break
            if verbose:
                logger.info(
                    "%s (%d bytes) does not fit on %s (%d of %d used)", name, size, device, used, limit
                )
            if used == 0 and device != "disk":
                unusable[device] = size + held
            used_on[device] = used + held
            device_index += 1
            used = 0
        if split_partner is not None:
            at = next(i for i, entry in enumerate(queue) if entry[0] == split_partner[0])
            queue[at : at + 1] = entries_of(*split_partner)
            queue.insert(0, (name, obj))
            continue
        if fallback is not None:
            front, *rest = _bring_forward(queue, fallback, entries_of)
            queue[:] = [front, (name, obj), *rest]
            continue
        if used + size > limit:
            # Too big for what is left here, but it can be split: place its parts one by one.
            if verbose:
                logger.info("splitting %s (%d bytes) to fit %s", name, size, device)
            queue[:0] = entries_of(name, obj)
            continue
        for entry_name, entry in [(name, obj), *partners]:
            device_map[entry_name] = device
            placed.add(entry_name)
            if isinstance(entry, torch.nn.Module):
                buffers_on[device] = buffers_on.get(device, 0) + sum(
                    buffer.numel() * buffer.element_size() for buffer in entry.buffers()
                )
        used += size
        if verbose:
            logger.info("putting %s (%d bytes) on %s", name, size, device)
    used_on[devices[device_index]] = used

    offloaded_buffers = buffers_on.get("cpu", 0) + buffers_on.get("disk", 0)
    if accelerators and offloaded_buffers and not offload_buffers:
        if not any(capacity[key] >= offloaded_buffers + used_on.get(key, 0) for key in accelerators):
            warnings.warn(
                f"the modules offloaded to cpu/disk hold {offloaded_buffers} bytes of buffers, which are kept on "
                "the execution device and do not fit any accelerator's remaining memory; pass "
                "offload_buffers=True if you run out of memory",
                UserWarning,
                stacklevel=3,
            )
    if unusable:
        needed = ", ".join(f"{device}: {size} bytes" for device, size in unusable.items())
        logger.info(
            "no module could be placed on these devices for insufficient memory (the first block each was "
            "offered needed): %s; give them more memory%s",
            needed,
            "" if fallback_allocation else " or pass fallback_allocation=True",
        )
    return device_map


def _fallback_block(
    queue: list[tuple[str, Any]],
    placed: set[str],
    sizes: dict[str, int],
    no_split: set[str],
    room: int,
    tied_groups: list[list[str]],
    tensor_names: Any,
) -> str | None:
    """The first block, breadth first through what is still queued, that fits in ``room`` bytes and shares
    no tied parameter (it is moved ahead of the others alone)."""
    tied = {name for group in tied_groups for name in group}
    search = [entry for entry in queue if entry[0] not in placed]
    while search:
        name, obj = search.pop(0)
        if sizes.get(name, 0) <= room and not tied & set(tensor_names(name, obj)):
            return name
        if isinstance(obj, torch.nn.Module) and type(obj).__name__ not in no_split:
            search.extend((f"{name}.{child}", sub) for child, sub in obj.named_children())
    return None


def _bring_forward(queue: list[tuple[str, Any]], chosen: str, entries_of: Any) -> list[tuple[str, Any]]:
    """``queue`` with the block ``chosen`` first: a queued module that contains it is split into its parts."""
    result: list[tuple[str, Any]] = []
    pending = list(queue)
    front: tuple[str, Any] | None = None
    while pending:
        name, obj = pending.pop(0)
        if name == chosen:
            front = (name, obj)
        elif chosen.startswith(name + "."):
            pending[:0] = entries_of(name, obj)
        else:
            result.append((name, obj))
    assert front is not None
    return [front, *result]


def resolve_device_map(
    model: torch.nn.Module,
    device_map: str | dict[str, Any] | None,
    max_memory: dict[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: torch.dtype | CustomDtype | str | None = None,
    special_dtypes: dict[str, torch.dtype | str] | None = None,
) -> dict[str, Any] | None:
    """Turn ``"auto"``/``"balanced"``/``"balanced_low_0"``/``"sequential"`` into a device map (a dict or None
    is returned as it is)."""
    if device_map is None or isinstance(device_map, dict):
        return device_map
    if device_map not in DEVICE_MAP_STRATEGIES:
        raise ValueError(
            f"device_map={device_map!r} is not valid; use one of {list(DEVICE_MAP_STRATEGIES)} "
            "or a dict {module name: device}"
        )
    if device_map != "sequential":
        max_memory = get_balanced_memory(
            model,
            max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            special_dtypes=special_dtypes,
            low_zero=device_map == "balanced_low_0",
        )
    return infer_auto_device_map(
        model,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        special_dtypes=special_dtypes,
    )
