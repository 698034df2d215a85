"""Accelerate's ``clear_device_cache`` (``accelerate.utils.memory``, served at ``drivetrain.utils.memory``)."""

import gc


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return the accelerator's cached, unused memory to the device (after a garbage collection when asked, so
    that tensors only garbage references keep are freed first)."""
    from drivetrain.operations.memory import empty_device_cache

    if garbage_collection:
        gc.collect()
    empty_device_cache()
