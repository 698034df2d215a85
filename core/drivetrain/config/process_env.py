"""The variables a launcher gives each process (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``; MPI's ``PMI_SIZE`` / ``OMPI_COMM_WORLD_SIZE``), read and checked in one place.

A value that is not what a launcher would write (``WORLD_SIZE=abc``, ``LOCAL_RANK=-5``, ``RANK=3`` beside
``WORLD_SIZE=2``) is a one-line :class:`~drivetrain.errors.ConfigurationError` naming the variable and what
is valid, raised before anything is set up: a process must never pick its device or its peers from a
number it misread.
"""

from __future__ import annotations

import dataclasses
import os

from drivetrain.errors import ConfigurationError

#: Where the number of processes comes from, first set wins: torchrun / drivetrain launch, then MPI launchers.
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")

_MEANING = {
    "WORLD_SIZE": "the number of processes",
    "PMI_SIZE": "the number of processes",
    "OMPI_COMM_WORLD_SIZE": "the number of processes",
    "RANK": "this process's index among all processes",
    "LOCAL_RANK": "this process's index on its machine",
    "LOCAL_WORLD_SIZE": "the number of processes on this machine",
}


def whole_number(variable: str, minimum: int) -> int | None:
    """Environment variable ``variable`` as a whole number >= ``minimum``; None when it is unset or empty.
    Anything else is an error naming the variable, what it means and what is valid."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return None
    try:
        number = int(raw)
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise ConfigurationError(
            f"environment variable {variable}={raw!r} is not valid: expected a whole number >= {minimum} "
            f"({_MEANING.get(variable, 'set by the launcher')}; the launcher sets it)"
        )
    return number


def world_size() -> int:
    """How many processes the launcher started (1 when not launched)."""
    for variable in WORLD_SIZE_VARIABLES:
        size = whole_number(variable, 1)
        if size is not None:
            return size
    return 1


@dataclasses.dataclass(frozen=True)
class ProcessPlace:
    """Where the launcher put this process."""

    world_size: int
    rank: int
    local_rank: int
    #: None when the launcher did not say (a plain ``python script.py``, some MPI launchers)
    local_world_size: int | None


def process_place() -> ProcessPlace:
    """This process's place as the launcher describes it, every variable checked against the others: ``RANK``
    below ``WORLD_SIZE``, ``LOCAL_RANK`` below ``LOCAL_WORLD_SIZE`` (when set)."""
    size = world_size()
    rank = whole_number("RANK", 0) or 0
    local_rank = whole_number("LOCAL_RANK", 0) or 0
    local_size = whole_number("LOCAL_WORLD_SIZE", 1)
    if rank >= size:
        raise ConfigurationError(
            f"environment variable RANK={rank} is not valid: expected a whole number below the number of "
            f"processes, {size} ({_world_size_source()})"
        )
    if local_size is not None and local_rank >= local_size:
        raise ConfigurationError(
            f"environment variable LOCAL_RANK={local_rank} is not valid: expected a whole number below "
            f"LOCAL_WORLD_SIZE={local_size}"
        )
    return ProcessPlace(world_size=size, rank=rank, local_rank=local_rank, local_world_size=local_size)


def _world_size_source() -> str:
    for variable in WORLD_SIZE_VARIABLES:
        if os.environ.get(variable, "").strip():
            return f"from {variable}"
    return "WORLD_SIZE is not set"
