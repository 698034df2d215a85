"""The machine's and the process's facts behind Accelerate's ``accelerate.utils.environment`` and
``accelerate.utils.other`` (served at those ``drivetrain.utils`` paths): the accelerator present, NVIDIA GPUs
through ``nvidia-smi`` (so that CUDA stays uninitialised), free ports, the operating system's kernel, and the
libraries already imported."""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import socket
import subprocess
import sys

from drivetrain.logging import get_logger

#: Named after Accelerate's module that warns about an old kernel (``accelerate.utils.other``).
logger = get_logger("drivetrain.utils.other")


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` already imported in this process."""
    return [name for name in library_names if name in sys.modules]


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type)`` of the accelerator present, found without initialising it; CUDA's
    pair when none of the others is."""
    from drivetrain.compat import availability
    from drivetrain.compat.accelerate_api import availability_checks

    for check, pair in availability.ACCELERATE_DEVICE_ORDER:
        if getattr(availability_checks, check)():
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


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on ``port`` (29500, torch's default rendezvous port, when None) on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("localhost", 29500 if port is None else port)) == 0


def get_free_port() -> int:
    """A port on localhost that nothing listens on (the operating system's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def check_os_kernel() -> None:
    """Warns (main process only) on a Linux kernel older than 5.5.0, where processes can hang."""
    from packaging.version import Version

    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is None:
        return
    if Version(found.group()) < Version("5.5.0"):
        logger.warning(
            f"Detected kernel version {found.group()}, which is below the recommended minimum of 5.5.0; this can "
            "cause the process to hang. It is recommended to upgrade the kernel to the minimum version or higher.",
            main_process_only=True,
        )
