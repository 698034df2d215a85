"""Pinning each process of a machine to its share of the cores (``drivetrain launch --enable_cpu_affinity``;
Accelerate's ``set_numa_affinity``). Imports only the configuration readers: ``PartialState`` calls it while
starting."""

from __future__ import annotations

import functools
import logging
import os

from drivetrain.config.process_env import whole_number
from drivetrain.config.sources import env_flag

#: Accelerate logs the pinning under its module ``utils.environment``; scripts and tests listen there.
logger = logging.getLogger("drivetrain.utils.environment")


def _local_processes() -> int:
    for variable in ("LOCAL_WORLD_SIZE", "ACCELERATE_NUM_PROCESSES"):
        value = whole_number(variable, 1)
        if value is not None:
            return value
    return 1


def _cpus_of_local_process(local_process_index: int) -> list[int] | None:
    """The cores of this process's share of the machine (cores split evenly across the local processes), or
    None when the platform cannot set affinity."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    available = sorted(os.sched_getaffinity(0))
    local_processes = max(1, _local_processes())
    share = max(1, len(available) // local_processes)
    start = (local_process_index % local_processes) * share
    return available[start : start + share] or None


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to its share of the machine's cores."""
    cores = _cpus_of_local_process(local_process_index)
    if cores is None:
        return
    os.sched_setaffinity(0, cores)
    if verbose if verbose is not None else env_flag("ACCELERATE_DEBUG_MODE"):
        logger.info(f"Assigning {len(cores)} cpu cores to process {local_process_index}: {cores}")


@functools.cache
def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """:func:`override_numa_affinity`, once per process index."""
    override_numa_affinity(local_process_index, verbose=verbose)
