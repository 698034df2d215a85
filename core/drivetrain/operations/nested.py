"""Helpers for nested data: any nesting of lists, tuples (namedtuples included) and mappings of tensors.

Every function returns the same structure with the same container types (``send_to_device``,
``recursively_apply``, ``concatenate``, ``find_batch_size``, ...).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import pickle
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from functools import update_wrapper
from typing import Any

import torch


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


def rebuild_mapping(mapping: Mapping, values: dict) -> Any:
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
        return rebuild_mapping(
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
        # Accelerate's exact wording: callers (and Accelerate's own tests) match on it.
        name = getattr(func, "__name__", repr(func))
        test_name = getattr(test_type, "__name__", repr(test_type))
        raise TypeError(
            f"Unsupported types ({type(data)}) passed to `{name}`. Only nested list/tuple/dicts of objects that are "
            f"valid for `{test_name}` should be passed."
        )
    return data


def iter_leaves(data: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every non-container leaf, in the order recursively_apply visits them."""
    if isinstance(data, (tuple, list)):
        for index, item in enumerate(data):
            yield from iter_leaves(item, f"{path}[{index}]")
    elif isinstance(data, Mapping):
        for key, value in data.items():
            yield from iter_leaves(value, f"{path}[{key!r}]")
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
        return rebuild_mapping(
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
        known = torch.device(device)
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
    for _, leaf in iter_leaves(data):
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
        return rebuild_mapping(
            first, {key: concatenate([item[key] for item in data], dim=dim) for key in first}
        )
    if isinstance(first, torch.Tensor):
        return torch.cat(list(data), dim=dim)
    if len(data) == 1:
        return first  # a single batch of anything is already "concatenated" (gathered metrics of one step)
    raise TypeError(f"can only concatenate tensors, got {type(first).__name__}")


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
