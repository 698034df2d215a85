"""Accelerate's ``accelerate.utils.environment`` (served at ``drivetrain.utils.environment``, with the machine's
facts from :mod:`drivetrain.compat.accelerate_api.machine`): reading flags, choices and ranks from environment
variables, writing them to an environment file, and undoing a test's ``ACCELERATE_*`` variables."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from drivetrain.config.sources import FALSE_WORDS, TRUE_WORDS
from drivetrain.logging import get_logger

#: Named after Accelerate's module, where scripts and tests listen (``assertLogs("...utils.environment")``).
logger = get_logger("drivetrain.utils.environment")

_TRUE, _FALSE = TRUE_WORDS, FALSE_WORDS  # the one boolean vocabulary (drivetrain.config.sources)
#: Characters that would break a ``KEY=value`` line of an environment file.
_FORBIDDEN = (";", "\n", "<", ">", " ")


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1 (or True with ``to_bool``) for y/yes/t/true/on/1, 0 (False) for n/no/f/false/off/0, any case."""
    lowered = value.lower()
    if lowered in _TRUE:
        return True if to_bool else 1
    if lowered in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r} (expected one of {', '.join(_TRUE + _FALSE)})")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first of ``env_keys`` set to a non-negative integer, else ``default``."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """``KEY=value\\n`` lines for an environment file; pairs that are empty or hold a forbidden character are
    skipped with a warning."""
    lines = []
    for key, value in current_env.items():
        text = key + value
        if key and value and not any(character in text for character in _FORBIDDEN):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning(
                f"WARNING: Skipping {key}={value} as it contains forbidden characters or missing values."
            )
    return lines


@dataclass
class CPUInformation:
    """Where this process sits in a multi-process CPU run."""

    rank: int = field(default=0, metadata={"help": "The rank of the current process."})
    world_size: int = field(default=1, metadata={"help": "The total number of processes in the world."})
    local_rank: int = field(
        default=0, metadata={"help": "The rank of the current process on the local node."}
    )
    local_world_size: int = field(
        default=1, metadata={"help": "The total number of processes on the local node."}
    )


def get_cpu_distributed_information() -> CPUInformation:
    """Rank and sizes from the variables MPI implementations and torch's launcher set (first found wins)."""
    return CPUInformation(
        rank=get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        world_size=get_int_from_env(
            ["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1
        ),
        local_rank=get_int_from_env(
            ["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"], 0
        ),
        local_world_size=get_int_from_env(
            [
                "LOCAL_WORLD_SIZE",
                "MPI_LOCALNRANKS",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "MV2_COMM_WORLD_LOCAL_SIZE",
            ],
            1,
        ),
    )


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: ``ACCELERATE_*`` variables the decorated function (or each ``test*`` method of the decorated
    class, and its setUp/tearDown) sets are removed afterwards, and those it changes are restored."""

    @contextmanager
    def restored() -> Iterator[None]:
        before = {key: value for key, value in os.environ.items() if key.startswith("ACCELERATE_")}
        try:
            yield
        finally:
            for key in [key for key in os.environ if key.startswith("ACCELERATE_")]:
                if key in before:
                    os.environ[key] = before[key]
                else:
                    del os.environ[key]

    def wrap(function: Callable) -> Callable:
        if getattr(function, "_purges_accelerate_environment", False):
            return function

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with restored():
                return function(*args, **kwargs)

        wrapper._purges_accelerate_environment = True  # type: ignore[attr-defined]
        return wrapper

    if not isinstance(func_or_cls, type):
        return wrap(func_or_cls)

    def wrap_tests(cls: type) -> type:
        for name in dir(cls):
            if name.startswith("test") and callable(getattr(cls, name)):
                setattr(cls, name, wrap(getattr(cls, name)))
        return cls

    wrap_tests(func_or_cls)
    # subclasses defined later (a test class deriving from a decorated base) are wrapped as they are created
    func_or_cls.__init_subclass__ = classmethod(lambda cls, **kwargs: wrap_tests(cls))  # type: ignore[assignment]
    return func_or_cls
