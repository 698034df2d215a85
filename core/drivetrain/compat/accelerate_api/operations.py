"""Accelerate's operations across processes that the kernel's :mod:`drivetrain.operations` does not need
(``accelerate.utils.operations`` and ``accelerate.utils.other``, served at those ``drivetrain.utils`` paths):
checking a collective's inputs in debug mode, naming the operation that failed, a tensor's shape sent from the
one process that has it, padding a batch for splitting, and waiting for every process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def _dtype_codes() -> dict[Any, int]:
    import torch

    return {
        torch.float: 1, torch.double: 2, torch.half: 3, torch.bfloat16: 4, torch.uint8: 5, torch.int8: 6,
        torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10,
    }  # fmt: skip


def _lazy(name: str) -> Any:
    if name == "TENSOR_TYPE_TO_INT":  # Accelerate's codes for sending a dtype inside an integer tensor
        return _dtype_codes()
    if name == "TENSOR_INT_TO_DTYPE":
        return {code: dtype for dtype, code in _dtype_codes().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    value = _lazy(name)
    globals()[name] = value  # made once: a constant is the same object at every read
    return value


def is_accelerator_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a tensor on the machine's accelerator (not the CPU)."""
    import torch

    return isinstance(tensor, torch.Tensor) and tensor.device.type not in ("cpu", "meta")


def verify_operation(function: Callable) -> Callable:
    """Decorator for a collective taking ``tensor`` first: in debug mode (``PartialState().debug``) of a
    multi-process run, checks that every process passes the same shapes on the state's device, raising a
    ``DistributedOperationException`` listing each process's shapes otherwise."""
    from drivetrain.operations import DistributedOperationException, find_device, gather_object
    from drivetrain.operations.nested import get_shape

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from drivetrain.state import PartialState

        state = PartialState()
        if state.num_processes == 1 or not getattr(state, "debug", False):
            return function(*args, **kwargs)
        operation = f"{function.__module__}.{function.__name__}"
        tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
        device = find_device(tensor)
        if device is not None and device.type != state.device.type:
            raise DistributedOperationException(
                f"One or more of the tensors passed to {operation} were not on the {device.type} while the "
                f"`Accelerator` is configured for {state.device.type}. Please move it to the {state.device.type} "
                f"before calling {operation}."
            )
        shapes = gather_object([get_shape(tensor)])
        if shapes[0] is not None and shapes.count(shapes[0]) != len(shapes):
            listed = "\n  - ".join(f"Process {rank}: {shape}" for rank, shape in enumerate(shapes))
            raise DistributedOperationException(
                "Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid."
                f"\n\nOperation: `{operation}`\nInput shapes:\n  - {listed}"
            )
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function: Callable) -> Callable:
    """Decorator: a ``DistributedOperationException`` inside ``function`` is re-raised naming ``function``,
    chained to the original."""
    from drivetrain.operations import DistributedOperationException

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            operation = f"{function.__module__}.{function.__name__}"
            raise DistributedOperationException(
                f"Error found while calling `{operation}`. Please see the earlier error for more details."
            ) from error

    return wrapper


def gather_tensor_shape(tensor: Any) -> tuple[Any, int]:
    """``(shape as a tensor, dtype code)`` of a tensor that exists on one process only (None elsewhere), on
    every process (a sum-reduction of a zero-filled buffer)."""
    import torch

    from drivetrain.operations import reduce
    from drivetrain.state import PartialState

    state = PartialState()
    buffer = torch.zeros(2**20, dtype=torch.int, device=state.device)
    if tensor is not None:
        code = _dtype_codes()[tensor.dtype]
        buffer[: tensor.dim() + 1] = torch.tensor([*tensor.shape, code], dtype=torch.int)
    buffer = reduce(buffer, reduction="sum")
    buffer = buffer[buffer.nonzero()]
    return buffer[:-1], int(buffer[-1:][0])


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad every tensor of ``tensor`` with zeros along its first dimension so that the batch splits across
    ``num_processes`` (Accelerate's arithmetic: e.g. a batch of 3 for 4 processes becomes 4)."""
    from drivetrain.operations import recursively_apply

    def pad(item: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
        per_process = batch_size // num_processes
        left_over = batch_size - per_process * num_processes
        to_pad = num_processes - batch_size if per_process == 0 else num_processes - per_process
        if left_over > to_pad and to_pad < 1:
            to_pad = left_over - to_pad
        new_shape = list(item.shape)
        new_shape[0] = batch_size + to_pad
        padded = item.new_zeros(tuple(new_shape))
        padded[
            tuple(slice(0, item.shape[dim]) if axis == dim else slice(None) for axis in range(len(new_shape)))
        ] = item
        return padded

    return recursively_apply(
        pad, tensor, error_on_other_type=True, batch_size=batch_size, num_processes=num_processes, dim=dim
    )


def wait_for_everyone() -> None:
    """Block until every process of the run reaches this point."""
    from drivetrain.state import PartialState

    PartialState().wait_for_everyone()
