"""Freeing memory, and finding a batch size that fits."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

# Messages of errors that mean "out of memory" (every device runtime's OOM message says "out of memory").
_OOM_MESSAGES = (
    "out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
)


def empty_device_cache() -> None:
    """Return the accelerator's cached blocks to its driver (whichever accelerator torch sees)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "empty_cache"):
        if accelerator.is_available():
            accelerator.empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop references and free cached memory; use as ``a, b = release_memory(a, b)``."""
    objects = list(objects)  # type: ignore[assignment]
    for index in range(len(objects)):
        objects[index] = None  # type: ignore[index]
    gc.collect()
    empty_device_cache()
    return objects  # type: ignore[return-value]


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True when ``exception`` means the batch did not fit in memory."""
    if isinstance(exception, torch.cuda.OutOfMemoryError):
        return True
    if isinstance(exception, (RuntimeError, MemoryError)) and exception.args:
        message = str(exception.args[0])
        return any(text in message for text in _OOM_MESSAGES)
    return isinstance(exception, MemoryError)


def find_executable_batch_size(function: Callable | None = None, starting_batch_size: int = 128) -> Callable:
    """Decorator: call ``function(batch_size, ...)`` and, each time it runs out of memory, halve the batch
    size and try again (as Accelerate's documentation describes). The decorated function must take the batch
    size as its first argument and is called without it."""
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size)

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        batch_size = starting_batch_size
        parameters = list(inspect.signature(function).parameters)
        if len(parameters) < len(args) + 1:
            raise TypeError(
                f"batch_size is passed to {function.__name__} by find_executable_batch_size; call it without "
                f"the batch size (got {len(args)} positional arguments for parameters {parameters})"
            )
        gc.collect()
        empty_device_cache()
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                gc.collect()
                empty_device_cache()
                batch_size //= 2

    return run
