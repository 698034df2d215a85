"""Accelerate's ``accelerate.utils.memory``: freeing memory and finding a batch size that fits."""

import gc

from drivetrain.contract.reexport import reexport


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return the accelerator's cached, unused memory to the device (after a garbage collection when asked, so
    that tensors only garbage references keep are freed first)."""
    from drivetrain.operations.memory import empty_device_cache

    if garbage_collection:
        gc.collect()
    empty_device_cache()


__getattr__, __dir__, _names = reexport(
    __name__,
    {
        "find_executable_batch_size": "drivetrain.operations.memory",
        "release_memory": "drivetrain.operations.memory",
        "should_reduce_batch_size": "drivetrain.operations.memory",
    },
)
__all__ = sorted([*_names, "clear_device_cache"])
