"""The three fp8 libraries this plugin drives, and whether each can be used here.

"Installed" is answered from package metadata (``importlib.util.find_spec``), never by importing: listing
plugins and choosing a backend must not pay for importing transformer_engine or msamp, nor trip over their
import-time GPU checks.
"""

from __future__ import annotations

import enum
import importlib.util

import attrs


class FP8BackendType(str, enum.Enum):
    """Which library runs fp8 (Accelerate's names). Members compare equal to their value."""

    NO = "NO"
    AO = "AO"
    TE = "TE"
    MSAMP = "MSAMP"

    def __str__(self) -> str:
        return str(self.value)


@attrs.define(frozen=True)
class Fp8Library:
    """One fp8 backend: its short name (``--fp8_backend``), the module it imports and how to install it."""

    name: str
    module: str
    label: str
    install: str
    #: what it needs besides the library (said in listings and errors)
    needs: str
    backend_type: FP8BackendType

    @property
    def available(self) -> bool:
        return module_installed(self.module)

    def missing_message(self, asked_by: str) -> str:
        return (
            f"fp8 backend {self.name!r} ({self.label}, asked for by {asked_by}) needs the {self.module!r} "
            f"package, which is not installed: {self.install}"
        )


TORCHAO = Fp8Library(
    name="ao",
    module="torchao",
    label="torchao float8 training",
    install="pip install torchao",
    needs="CPU or GPU (float8 matmuls run fast on NVIDIA GPUs with compute capability >= 8.9)",
    backend_type=FP8BackendType.AO,
)
TRANSFORMER_ENGINE = Fp8Library(
    name="te",
    module="transformer_engine",
    label="NVIDIA TransformerEngine",
    install="pip install --no-build-isolation transformer-engine[pytorch] (needs the CUDA toolkit)",
    needs="an NVIDIA GPU with fp8 support (Ada, Hopper or newer) and the CUDA toolkit to build it",
    backend_type=FP8BackendType.TE,
)
MSAMP = Fp8Library(
    name="msamp",
    module="msamp",
    label="Microsoft MS-AMP",
    install="MS-AMP is not on PyPI; build it from source (https://github.com/Azure/MS-AMP)",
    needs="an NVIDIA GPU with fp8 support and MS-AMP built from source",
    backend_type=FP8BackendType.MSAMP,
)

#: The order in which the first installed library is chosen when nothing names one (Accelerate 1.x order).
AUTOMATIC_ORDER = (TORCHAO, TRANSFORMER_ENGINE, MSAMP)
BY_NAME = {library.name: library for library in AUTOMATIC_ORDER}


def module_installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_torchao_available() -> bool:
    return TORCHAO.available


def is_transformer_engine_available() -> bool:
    return TRANSFORMER_ENGINE.available


def is_msamp_available() -> bool:
    return MSAMP.available


def is_fp8_available() -> bool:
    """True when at least one fp8 library is installed."""
    return any(library.available for library in AUTOMATIC_ORDER)
