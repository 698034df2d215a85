"""Operations on nested data and the collectives users call: gather, broadcast, reduce, pad, send_to_device.

Every function accepts a tensor or any nesting of lists, tuples (namedtuples included), and mappings of
tensors, and returns the same structure with the same container types. The collectives go through
``PartialState().collectives`` (see :mod:`drivetrain.collectives`), so a backend or device plugin changes how
bytes move without touching this file. On one process every collective returns its input (``reduce``
returns a copy).

In debug mode (``DRIVETRAIN_DEBUG_MODE=1``) gather, broadcast, reduce and pad first exchange the shapes of
their inputs and raise :class:`DistributedOperationException` naming the mismatching ranks, instead of
letting torch.distributed hang on tensors of different sizes.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import pickle
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from functools import update_wrapper
from typing import TYPE_CHECKING, Any

import torch

from drivetrain.errors import DrivetrainError

if TYPE_CHECKING:
    from drivetrain.state import GradientState, PartialState

logger = logging.getLogger(__name__)

#: reductions accepted by :func:`reduce`
REDUCE_CHOICES = ("mean", "sum", "max", "min", "product", "none")


class DistributedOperationException(DrivetrainError):
    """A collective got inputs that do not match across processes (raised in debug mode on every rank)."""


@dataclasses.dataclass(frozen=True)
class TensorInformation:
    """Shape and dtype of a tensor, enough to allocate a receiving buffer (see :func:`initialize_tensors`)."""

    shape: torch.Size
    dtype: torch.dtype


# -- structure ---------------------------------------------------------------------------------------------------
def is_torch_tensor(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor)


def is_tensor_information(obj: Any) -> bool:
    return isinstance(obj, TensorInformation)


def is_namedtuple(obj: Any) -> bool:
    """Whether ``obj`` is an instance of a ``collections.namedtuple`` / ``typing.NamedTuple`` class."""
    return isinstance(obj, tuple) and hasattr(obj, "_fields") and hasattr(obj, "_asdict")


def honor_type(obj: Any, items: Any) -> Any:
    """A list or tuple of the same type as ``obj`` holding ``items`` (namedtuples take positional fields)."""
    items = list(items)
    if type(obj) is list:
        return items
    if is_namedtuple(obj):
        return type(obj)(*items)
    # tuple, list subclasses and torch's structseqs (torch.return_types.*) take one sequence.
    return type(obj)(items)


def _rebuild_mapping(mapping: Mapping, values: dict) -> Any:
    """A mapping of ``mapping``'s type holding ``values``."""
    kind: Any = type(mapping)
    if kind is dict:
        return values
    if isinstance(mapping, collections.defaultdict):
        rebuilt = kind(mapping.default_factory)
        rebuilt.update(values)
        return rebuilt
    try:
        return kind(values)
    except TypeError:
        # A mapping class whose constructor wants other arguments: copy it and swap the values in.
        if not isinstance(mapping, MutableMapping):
            raise TypeError(
                f"cannot rebuild a {kind.__name__}: its constructor does not accept a dict and it is not mutable"
            ) from None
        duplicate: Any = copy.copy(mapping)
        duplicate.clear()
        duplicate.update(values)
        return duplicate


def recursively_apply(
    func: Callable,
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply ``func(leaf, *args, **kwargs)`` to every leaf of ``data`` for which ``test_type`` is true,
    keeping lists, tuples, namedtuples and mappings (with their types). Other leaves are returned unchanged,
    or raise ``TypeError`` when ``error_on_other_type``."""
    if isinstance(data, (tuple, list)):
        return honor_type(
            data,
            [
                recursively_apply(
                    func, item, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for item in data
            ],
        )
    if isinstance(data, Mapping):
        return _rebuild_mapping(
            data,
            {
                key: recursively_apply(
                    func, value, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for key, value in data.items()
            },
        )
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        name = getattr(func, "__name__", repr(func))
        raise TypeError(
            f"unsupported type {type(data).__name__} passed to {name}: only tensors nested in lists, tuples and "
            f"dicts are accepted (leaves must satisfy {getattr(test_type, '__name__', 'test_type')})"
        )
    return data


def _leaves(data: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every non-container leaf, in the order recursively_apply visits them."""
    if isinstance(data, (tuple, list)):
        for index, item in enumerate(data):
            yield from _leaves(item, f"{path}[{index}]")
    elif isinstance(data, Mapping):
        for key, value in data.items():
            yield from _leaves(value, f"{path}[{key!r}]")
    else:
        yield path, data


# -- moving data ---------------------------------------------------------------------------------------------------
def _move(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    # Objects with their own ``to`` (BatchEncoding, modules, user batches) move themselves.
    try:
        return obj.to(device, non_blocking=non_blocking)
    except TypeError:  # a ``to`` without non_blocking
        return obj.to(device)


def _send(data: Any, device: torch.device, non_blocking: bool, skip_keys: Any) -> Any:
    kind = type(data)
    if kind is torch.Tensor or isinstance(data, torch.Tensor):
        # Already there is the common case on the data-loader path: skip Tensor.to's dispatch.
        if data.device == device:
            return data
        return data.to(device, non_blocking=non_blocking)
    if kind is tuple or kind is list:
        return kind([_send(item, device, non_blocking, skip_keys) for item in data])
    if kind is dict:
        return {
            key: value if key in skip_keys else _send(value, device, non_blocking, skip_keys)
            for key, value in data.items()
        }
    if hasattr(data, "to"):
        return _move(data, device, non_blocking)
    if isinstance(data, (tuple, list)):
        return honor_type(data, [_send(item, device, non_blocking, skip_keys) for item in data])
    if isinstance(data, Mapping):
        return _rebuild_mapping(
            data,
            {
                key: value if key in skip_keys else _send(value, device, non_blocking, skip_keys)
                for key, value in data.items()
            },
        )
    return data


_DEVICES: dict[Any, torch.device] = {}


def _as_device(device: Any) -> torch.device:
    # Building a torch.device from a string costs as much as the whole tensor check; remember them.
    known = _DEVICES.get(device)
    if known is None:
        known = torch.device(
            "npu:0" if device == "npu" else device
        )  # torch_npu needs an index the first time
        if len(_DEVICES) < 64:
            _DEVICES[device] = known
    return known


def send_to_device(tensor: Any, device: Any, non_blocking: bool = False, skip_keys: Any = None) -> Any:
    """Move every tensor (and every object with a ``to`` method) in ``tensor`` to ``device``.

    Tensors already on ``device`` are returned as they are (no copy). ``skip_keys`` (a key or a list of keys)
    names mapping entries to leave where they are.
    """
    if not isinstance(device, torch.device):
        device = _as_device(device)
    if skip_keys is None:
        skip_keys = ()
    elif isinstance(skip_keys, str):
        skip_keys = (skip_keys,)
    return _send(tensor, device, non_blocking, skip_keys)


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor in ``data`` (None when it holds no tensor)."""
    for _, leaf in _leaves(data):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return None


# -- describing and rebuilding ------------------------------------------------------------------------------------
def get_data_structure(data: Any) -> Any:
    """``data`` with every tensor replaced by its :class:`TensorInformation`."""
    return recursively_apply(lambda tensor: TensorInformation(shape=tensor.shape, dtype=tensor.dtype), data)


def get_shape(data: Any) -> Any:
    """``data`` with every tensor replaced by its shape as a list."""
    return recursively_apply(lambda tensor: list(tensor.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Empty tensors laid out like ``data_structure`` (the result of :func:`get_data_structure`)."""
    return recursively_apply(
        lambda info: torch.empty(info.shape, dtype=info.dtype),
        data_structure,
        test_type=is_tensor_information,
    )


def find_batch_size(data: Any) -> int:
    """The size of the first dimension of the first tensor in ``data``."""
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"cannot find the batch size of an empty {type(data).__name__}")
    if isinstance(data, (tuple, list)):
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        return find_batch_size(next(iter(data.values())))
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"can only find the batch size of tensors, got {type(data).__name__}")
    if data.dim() == 0:
        raise ValueError("cannot find the batch size of a 0-dimensional tensor")
    return data.shape[0]


def ignorant_find_batch_size(data: Any) -> int | None:
    """:func:`find_batch_size`, or None where it cannot tell."""
    try:
        return find_batch_size(data)
    except (TypeError, ValueError):
        return None


def listify(data: Any) -> Any:
    """``data`` with every tensor turned into (nested) Python numbers."""

    def to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:  # .tolist() has no bfloat16
            tensor = tensor.float()
        return tensor.tolist()

    return recursively_apply(to_list, data)


def slice_tensors(
    data: Any, tensor_slice: Any, process_index: int | None = None, num_processes: int | None = None
) -> Any:
    """``tensor[tensor_slice]`` for every tensor in ``data`` (the extra arguments are accepted for
    compatibility with custom slicing functions and ignored)."""
    return recursively_apply(lambda tensor: tensor[tensor_slice], data)


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of identically nested structures of tensors, leaf by leaf, along ``dim``."""
    if not isinstance(data, (list, tuple)) or len(data) == 0:
        raise ValueError("concatenate needs a non-empty list of structures to concatenate")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(
            first, [concatenate([item[i] for item in data], dim=dim) for i in range(len(first))]
        )
    if isinstance(first, Mapping):
        return _rebuild_mapping(
            first, {key: concatenate([item[key] for item in data], dim=dim) for key in first}
        )
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"can only concatenate tensors, got {type(first).__name__}")
    return torch.cat(list(data), dim=dim)


def convert_to_fp32(tensor: Any) -> Any:
    """``tensor`` with every float16/bfloat16 tensor converted to float32; other leaves untouched."""

    def is_half(obj: Any) -> bool:
        return isinstance(obj, torch.Tensor) and obj.dtype in (torch.float16, torch.bfloat16)

    return recursively_apply(lambda half: half.float(), tensor, test_type=is_half)


class ConvertOutputsToFp32:
    """Wrap a forward function so that its half-precision outputs come back in float32."""

    def __init__(self, model_forward: Callable) -> None:
        self.model_forward = model_forward
        update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "cannot pickle a model prepared with automatic mixed precision: unwrap it first with "
            "accelerator.unwrap_model(model)"
        )


def convert_outputs_to_fp32(model_forward: Callable) -> Callable:
    """A forward function whose half-precision outputs are converted to float32 (``__wrapped__`` keeps the
    original so that unwrapping can remove it)."""
    wrapped = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return wrapped(*args, **kwargs)

    forward.__wrapped__ = wrapped  # type: ignore[attr-defined]
    return forward


# -- debug-mode checks ---------------------------------------------------------------------------------------------
def _signature(data: Any) -> list[tuple[str, str, tuple[int, ...] | None, str | None]]:
    """What every rank must agree on: each leaf's path, kind, shape and dtype."""
    signature: list[tuple[str, str, tuple[int, ...] | None, str | None]] = []
    for path, leaf in _leaves(data):
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


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False, state: PartialState | None = None
) -> Any:
    """Pad every tensor along ``dim`` to the largest size any process has there, with ``pad_index``, at the
    end (or at the start with ``pad_first``), so that the tensors can be gathered. Tensors with fewer than
    ``dim + 1`` dimensions and nested tensors are left as they are. One collective for the whole structure."""
    state = _current_state(state)
    if state.num_processes == 1:
        return tensor
    if state.debug:
        verify_across_processes("pad_across_processes", tensor, state, compare="ndim")

    def paddable(leaf: torch.Tensor) -> bool:
        return not getattr(leaf, "is_nested", False) and -leaf.dim() <= dim < leaf.dim()

    leaves = [leaf for _, leaf in _leaves(tensor)]
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
    return all(isinstance(leaf, torch.Tensor) for _, leaf in _leaves(data))


def gather_for_metrics(
    input_data: Any,
    use_gather_object: bool = False,
    state: PartialState | None = None,
    gradient_state: GradientState | None = None,
) -> Any:
    """Gather ``input_data`` from every process for computing metrics, dropping the samples that were
    duplicated to make the last batch divide evenly across processes.

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
    data = gather_object(input_data, state=state) if use_gather_object else gather(input_data, state=state)
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
