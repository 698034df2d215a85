"""The collectives users call: gather, broadcast, reduce, pad, gather_for_metrics — on any nesting of tensors.

They go through ``PartialState().collectives`` (the :class:`~drivetrain.contract.environment.Collectives` the
backend returned from ``setup_process_group``), so a backend or device plugin changes how bytes move without
touching this file. On one process every collective returns its input (``reduce`` returns a copy).

In debug mode (``DRIVETRAIN_DEBUG_MODE=1``) gather, broadcast, reduce and pad first exchange the shapes of
their inputs and raise :class:`DistributedOperationException` naming the mismatching ranks, instead of
letting torch.distributed hang on tensors of different sizes.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from drivetrain.errors import DrivetrainError
from drivetrain.operations.nested import iter_leaves, recursively_apply

if TYPE_CHECKING:
    from drivetrain.state import GradientState, PartialState

logger = logging.getLogger(__name__)

#: reductions accepted by :func:`reduce`
REDUCE_CHOICES = ("mean", "sum", "max", "min", "product", "none")


class DistributedOperationException(DrivetrainError):
    """A collective got inputs that do not match across processes (raised in debug mode on every rank)."""


# -- debug-mode checks ---------------------------------------------------------------------------------------------
def _signature(data: Any) -> list[tuple[str, str, tuple[int, ...] | None, str | None]]:
    """What every rank must agree on: each leaf's path, kind, shape and dtype."""
    signature: list[tuple[str, str, tuple[int, ...] | None, str | None]] = []
    for path, leaf in iter_leaves(data):
        if isinstance(leaf, torch.Tensor):
            signature.append((path, "tensor", tuple(leaf.shape), str(leaf.dtype)))
        else:
            signature.append((path, type(leaf).__name__, None, None))
    return signature


def _by_rank(values: list[Any], show: Callable[[Any], str]) -> str:
    """``rank 0 (4, 3), rank 1 (2, 3)``, grouping ranks that agree: ``ranks 0, 2 (4, 3), rank 1 (2, 3)``."""
    groups: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(show(value), []).append(rank)
    parts = []
    for text, ranks in groups.items():
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        parts.append(f"{label} {text}")
    return ", ".join(parts)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def verify_across_processes(operation: str, data: Any, state: PartialState, compare: str = "shape") -> None:
    """Raise :class:`DistributedOperationException` on every rank when ``data`` differs across ranks in
    structure, dtype, and ``compare`` ("shape": every dimension, "ndim": number of dimensions only).
    One ``all_gather_object`` of a small description, so it cannot hang on mismatched sizes."""
    signatures = state.collectives.all_gather_object(_signature(data))
    paths = [[entry[:2] for entry in signature] for signature in signatures]
    if any(other != paths[0] for other in paths[1:]):
        raise DistributedOperationException(
            f"{operation}: the data structure differs across processes: "
            + _by_rank(
                paths, lambda leaves: "[" + ", ".join(f"{kind} at data{path}" for path, kind in leaves) + "]"
            )
            + "; every process must pass the same nesting of tensors"
        )
    for index, (path, kind, _, _) in enumerate(signatures[0]):
        if kind != "tensor":
            continue
        where = f" at data{path}" if path else ""
        shapes = [signature[index][2] for signature in signatures]
        dtypes = [signature[index][3] for signature in signatures]
        if compare == "shape" and len(set(shapes)) > 1:
            hint = {
                "gather": "pad them to a common size with pad_across_processes first",
                "gather_for_metrics": "pad them to a common size with pad_across_processes first",
                "broadcast": "every process must pass a tensor of the source's shape to receive into",
            }.get(operation, "every process must pass tensors of the same shape")
            raise DistributedOperationException(
                f"{operation}: tensor shapes differ across processes{where}: "
                f"{_by_rank(shapes, _shape_text)}; {hint}"
            )
        if compare == "ndim" and len({len(shape) for shape in shapes}) > 1:
            raise DistributedOperationException(
                f"{operation}: tensors have different numbers of dimensions across processes{where}: "
                f"{_by_rank(shapes, _shape_text)}; only the size along the padded dimension may differ"
            )
        if len(set(dtypes)) > 1:
            raise DistributedOperationException(
                f"{operation}: tensor dtypes differ across processes{where}: {_by_rank(dtypes, str)}"
            )


def _current_state(state: PartialState | None = None) -> PartialState:
    if state is not None:
        return state
    from drivetrain.state import PartialState

    return PartialState()


# -- collectives ----------------------------------------------------------------------------------------------------
def gather(tensor: Any, state: PartialState | None = None) -> Any:
    """Concatenate every process's tensors along dimension 0, in rank order (a 0-dimensional tensor
    becomes one element per process). All processes must pass tensors of the same shape: pad them with
    :func:`pad_across_processes` first. On one process, returns ``tensor`` unchanged."""
    state = _current_state(state)
    if state.num_processes == 1:
        return tensor
    if state.debug:
        verify_across_processes("gather", tensor, state)
    collectives = state.collectives

    def gather_one(leaf: torch.Tensor) -> torch.Tensor:
        if leaf.dim() == 0:
            leaf = leaf.reshape(1)
        return torch.cat(collectives.all_gather(leaf), dim=0)

    return recursively_apply(gather_one, tensor, error_on_other_type=True)


def _flatten_gathered(objects: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for obj in objects:
        if isinstance(obj, (list, tuple, torch.Tensor)):
            flat.extend(obj)
        else:
            flat.append(obj)
    return flat


def gather_object(object: Any, state: PartialState | None = None) -> Any:
    """Every process's picklable ``object``, as one list in rank order: lists, tuples and tensors are
    concatenated (``[a, b]`` on rank 0 and ``[c]`` on rank 1 give ``[a, b, c]``), any other object is one
    element. On one process, returns ``object`` unchanged."""
    state = _current_state(state)
    if state.num_processes == 1:
        return object
    return _flatten_gathered(state.collectives.all_gather_object(object))


def _check_source(operation: str, from_process: int, state: PartialState) -> None:
    if not isinstance(from_process, int) or not 0 <= from_process < state.num_processes:
        raise ValueError(
            f"{operation}: from_process={from_process!r} is not a process index; valid: 0 to "
            f"{state.num_processes - 1}"
        )


def broadcast(tensor: Any, from_process: int = 0, state: PartialState | None = None) -> Any:
    """Copy process ``from_process``'s tensors into every process's tensors of the same shape (in place),
    and return the structure."""
    state = _current_state(state)
    if state.num_processes == 1:
        return tensor
    _check_source("broadcast", from_process, state)
    if state.debug:
        verify_across_processes("broadcast", tensor, state)
    collectives = state.collectives

    def broadcast_one(leaf: torch.Tensor) -> torch.Tensor:
        if leaf.is_contiguous():
            return collectives.broadcast(leaf, src=from_process)
        buffer = collectives.broadcast(leaf.contiguous(), src=from_process)
        return leaf.copy_(buffer)

    return recursively_apply(broadcast_one, tensor, error_on_other_type=True)


def broadcast_object_list(
    object_list: list[Any], from_process: int = 0, state: PartialState | None = None
) -> list[Any]:
    """Replace the items of ``object_list`` (in place) with those of process ``from_process``'s list,
    which must have the same length, and return it."""
    if not isinstance(object_list, list):
        raise TypeError(
            f"broadcast_object_list needs a list (it is filled in place), got {type(object_list).__name__}"
        )
    state = _current_state(state)
    if state.num_processes == 1:
        return object_list
    _check_source("broadcast_object_list", from_process, state)
    return state.collectives.broadcast_object_list(object_list, src=from_process)


def copy_tensor_to_devices(
    tensor: torch.Tensor | None = None, state: PartialState | None = None
) -> torch.Tensor:
    """Give every process the tensor that exactly one process holds (the others pass None and need not know
    its shape). Returns it on every process, on this process's device."""
    state = _current_state(state)
    if state.num_processes == 1:
        if tensor is None:
            raise ValueError("copy_tensor_to_devices: the only process passed None")
        return tensor
    info = None if tensor is None else (tuple(tensor.shape), tensor.dtype)
    infos = state.collectives.all_gather_object(info)
    holders = [rank for rank, item in enumerate(infos) if item is not None]
    if len(holders) != 1:
        raise ValueError(
            "copy_tensor_to_devices: exactly one process must pass a tensor (the others None); "
            f"processes passing one: {holders or 'none'}"
        )
    shape, dtype = infos[holders[0]]
    if tensor is None:
        tensor = torch.empty(shape, dtype=dtype, device=state.device)
    return state.collectives.broadcast(tensor.contiguous(), src=holders[0])


def reduce(
    tensor: Any, reduction: str = "mean", scale: float = 1.0, state: PartialState | None = None
) -> Any:
    """Combine every process's tensors element-wise: ``"mean"``, ``"sum"``, ``"max"``, ``"min"``,
    ``"product"``, or ``"none"`` (no communication, a copy of the local values). The result is multiplied
    by ``scale`` (except with ``"none"``). Returns new tensors; the inputs are left untouched. The mean of an
    integer tensor is a floating-point tensor."""
    if reduction not in REDUCE_CHOICES:
        raise ValueError(f"reduce: unknown reduction {reduction!r}; valid: {', '.join(REDUCE_CHOICES)}")
    state = _current_state(state)
    distributed = state.num_processes > 1 and reduction != "none"
    if distributed and state.debug:
        verify_across_processes("reduce", tensor, state)
    collectives = state.collectives
    num_processes = state.num_processes

    def reduce_one(leaf: torch.Tensor) -> torch.Tensor:
        result = leaf.clone()
        if reduction == "none":
            return result
        if distributed:
            collectives.all_reduce(result, op="sum" if reduction == "mean" else reduction)
        if reduction == "mean" and num_processes > 1:
            result = result.div_(num_processes) if result.is_floating_point() else result / num_processes
        if scale != 1.0:
            result = result * scale
        return result

    return recursively_apply(reduce_one, tensor, error_on_other_type=True)


class CannotPadNestedTensorWarning(UserWarning):
    """Warned when ``pad_across_processes`` meets a nested tensor, which it leaves as it is (its rows have no
    common size to pad to)."""


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False, state: PartialState | None = None
) -> Any:
    """Pad every tensor along ``dim`` to the largest size any process has there, with ``pad_index``, at the
    end (or at the start with ``pad_first``), so that the tensors can be gathered. Tensors with fewer than
    ``dim + 1`` dimensions and nested tensors are left as they are. One collective for the whole structure."""
    if any(getattr(leaf, "is_nested", False) for _, leaf in iter_leaves(tensor)):
        warnings.warn(
            "Cannot pad nested tensors without more information. Leaving unprocessed.",
            CannotPadNestedTensorWarning,
            stacklevel=2,
        )
    state = _current_state(state)
    if state.num_processes == 1:
        return tensor
    if state.debug:
        verify_across_processes("pad_across_processes", tensor, state, compare="ndim")

    def paddable(leaf: torch.Tensor) -> bool:
        return not getattr(leaf, "is_nested", False) and -leaf.dim() <= dim < leaf.dim()

    leaves = [leaf for _, leaf in iter_leaves(tensor)]
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"pad_across_processes: unsupported type {type(leaf).__name__}; pass tensors nested in lists, "
                "tuples and dicts"
            )
    sizes = [leaf.shape[dim] for leaf in leaves if paddable(leaf)]
    if not sizes:
        return tensor
    local = torch.tensor(sizes, dtype=torch.int64, device=leaves[0].device)
    largest = torch.stack(state.collectives.all_gather(local)).amax(dim=0).tolist()
    targets = iter(largest)

    def pad_one(leaf: torch.Tensor) -> torch.Tensor:
        if not paddable(leaf):
            return leaf
        target = next(targets)
        axis = dim % leaf.dim()
        size = leaf.shape[axis]
        if size == target:
            return leaf
        new_shape = list(leaf.shape)
        new_shape[axis] = target
        padded = leaf.new_full(new_shape, pad_index)
        start = target - size if pad_first else 0
        padded.narrow(axis, start, size).copy_(leaf)
        return padded

    return recursively_apply(pad_one, tensor)


def _holds_only_tensors(data: Any) -> bool:
    return all(isinstance(leaf, torch.Tensor) for _, leaf in iter_leaves(data))


def gather_for_metrics(
    input_data: Any,
    use_gather_object: bool = False,
    state: PartialState | None = None,
    gradient_state: GradientState | None = None,
) -> Any:
    """Gather ``input_data`` from every process for computing metrics, dropping the samples that were
    duplicated to make the last batch divide evenly across processes.

    Under N-D parallelism (a tensor- or context-parallel dimension, whose ranks see the same batches) it
    gathers one copy per data-parallel share, in share order: each sample once, as in plain data
    parallelism (Accelerate gathers every rank's copy there).

    Tensors are gathered with :func:`gather` (concatenated along dimension 0); anything else, or everything
    when ``use_gather_object``, goes through :func:`gather_object` (a flat list). On the last batch of the
    active data loader (``gradient_state.end_of_dataloader``) the result is cut to
    ``gradient_state.remainder`` samples, the number of real samples in that global batch; a remainder of -1
    (the loader does not know its length) leaves the result as gathered.
    """
    state = _current_state(state)
    if gradient_state is None:
        from drivetrain.state import GradientState

        gradient_state = GradientState()
    use_gather_object = use_gather_object or not _holds_only_tensors(input_data)
    shares = _data_parallel_representatives(state)
    if shares is not None:
        data = _gather_shares(input_data, state, shares, use_gather_object)
    elif use_gather_object:
        data = gather_object(input_data, state=state)
    else:
        data = gather(input_data, state=state)
    if not gradient_state.end_of_dataloader:
        return data
    remainder = gradient_state.remainder
    if remainder == -1:
        logger.info(
            "gather_for_metrics: the data loader does not know its length, so duplicated samples at the end "
            "were not removed; drop them yourself"
        )
        return data
    if remainder > 0:
        if use_gather_object:
            return data[:remainder]
        return recursively_apply(lambda leaf: leaf[:remainder], data)
    return data


# -- N-D layouts: one copy per data-parallel share ------------------------------------------------------------
#: environment -> the world rank holding each data-parallel share (computed once per process group)
_representatives: dict[int, tuple[Any, list[int]]] = {}


def _data_parallel_representatives(state: PartialState) -> list[int] | None:
    """For each data-parallel share, in share order, the lowest world rank that holds it; None when every
    process is its own share (no tensor/context-parallel dimension)."""
    environment = state.environment
    size, rank = environment.data_shards
    if size == state.num_processes:
        return None
    cached = _representatives.get(id(environment))
    if cached is None or cached[0] is not environment:
        shares = state.collectives.all_gather_object(rank)
        first = {share: shares.index(share) for share in range(size)}
        cached = (environment, [first[share] for share in range(size)])
        _representatives.clear()
        _representatives[id(environment)] = cached
    return cached[1]


def _gather_shares(data: Any, state: PartialState, shares: list[int], use_gather_object: bool) -> Any:
    collectives = state.collectives
    if use_gather_object:
        gathered = collectives.all_gather_object(data)
        return _flatten_gathered([gathered[rank] for rank in shares])
    if state.debug:
        verify_across_processes("gather_for_metrics", data, state)

    def gather_one(leaf: torch.Tensor) -> torch.Tensor:
        if leaf.dim() == 0:
            leaf = leaf.reshape(1)
        gathered = collectives.all_gather(leaf)
        return torch.cat([gathered[rank] for rank in shares], dim=0)

    return recursively_apply(gather_one, data, error_on_other_type=True)
