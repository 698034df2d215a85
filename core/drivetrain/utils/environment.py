"""Accelerate's ``accelerate.utils.environment``: reading flags and choices from environment variables, and what
the machine offers (processors, GPUs through ``nvidia-smi`` so that CUDA stays uninitialised)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from drivetrain.config.sources import FALSE_WORDS, TRUE_WORDS
from drivetrain.contract.reexport import reexport
from drivetrain.logging import get_logger

logger = get_logger(__name__)

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


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` already imported in this process."""
    return [name for name in library_names if name in sys.modules]


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type)`` of the accelerator present, found without initialising it; CUDA's
    pair when none of the others is."""
    from drivetrain.compat import availability
    from drivetrain.utils import imports

    for check, pair in availability.ACCELERATE_DEVICE_ORDER:
        if getattr(imports, check)():
            return pair
    return "cuda", "MULTI_GPU"


def _nvidia_smi() -> str:
    if sys.platform == "win32":
        found = shutil.which("nvidia-smi")
        return found or os.path.join(
            os.environ.get("systemdrive", "C:"),
            "Program Files",
            "NVIDIA Corporation",
            "NVSMI",
            "nvidia-smi.exe",
        )
    return "nvidia-smi"


def _query_gpus(field_names: str) -> list[str]:
    output = subprocess.check_output(
        [_nvidia_smi(), f"--query-gpu={field_names}", "--format=csv,noheader"], text=True
    )
    return output.strip().splitlines()


def get_gpu_info() -> tuple[list[str], int]:
    """``(names, count)`` of the NVIDIA GPUs, from ``nvidia-smi`` (raises when it is not there)."""
    rows = _query_gpus("count,name")
    return [row.split(",", 1)[1].strip() for row in rows], len(rows)


def get_driver_version() -> str:
    return _query_gpus("driver_version")[0]


def check_cuda_p2p_ib_support() -> bool:
    """False for several consumer GPUs of the RTX 40 series under a driver older than 550.40.07 (peer-to-peer and
    InfiniBand transfers hang there); True otherwise, and when nothing can be asked."""
    from packaging.version import parse

    try:
        device_names, count = get_gpu_info()
        if count > 1 and any("RTX 40" in name for name in device_names):
            return parse(get_driver_version()) >= parse("550.40.07")
    except Exception:  # no nvidia-smi, no GPU: nothing to warn about
        pass
    return True


@functools.lru_cache(maxsize=1)
def check_cuda_float8_capability() -> bool:
    """Whether the first GPU has compute capability 8.9 or higher (needed for 8-bit floating point)."""
    try:
        capability = tuple(int(part) for part in _query_gpus("compute_capability")[0].split("."))
    except Exception:
        import torch

        capability = torch.cuda.get_device_capability()
    return capability >= (8, 9)


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


__getattr__, __dir__, _names = reexport(
    __name__,
    {
        "patch_environment": "drivetrain.environment",
        "clear_environment": "drivetrain.environment",
        "override_numa_affinity": "drivetrain.affinity",
        "set_numa_affinity": "drivetrain.affinity",
    },
)
__all__ = sorted(
    {
        *_names,
        *(name for name, value in globals().items() if getattr(value, "__module__", None) == __name__),
        "logger",
    }
)
