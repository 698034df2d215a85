"""Accelerate's ``is_*_available`` checks, as specifications evaluated by
``drivetrain.compat.accelerate_api.availability_checks`` (a check never imports the library it asks about), and
the device facts of Accelerate's utility functions."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Package:
    """A library a check looks for: importable as ``import_name``, installed as ``distribution`` (the import
    name's first part when None), at ``min_version`` or newer when given."""

    import_name: str
    distribution: str | None = None
    min_version: str | None = None


@dataclass(frozen=True)
class Device:
    """A device a check asks torch about: ``torch.<attribute>.is_available()`` (a dotted path), after importing
    ``package`` (the vendor's extension that registers the device) when given."""

    attribute: str
    package: str | None = None


@dataclass(frozen=True)
class AvailabilitySpec:
    """How one of Accelerate's ``is_*_available`` checks answers: True when every condition given holds.

    ``packages``: any of them installed; ``any_of``: any of these other checks true; ``device``: available;
    ``env``: ``(variable, default)``, the variable read as a boolean must be true; ``min_torch``: torch at least
    this version; ``gaudi1``: the device is a first-generation Gaudi.
    """

    packages: tuple[Package, ...] = ()
    any_of: tuple[str, ...] = ()
    device: Device | None = None
    env: tuple[str, str] | None = None
    min_torch: str | None = None
    gaudi1: bool = False


_HABANA = "habana_frameworks.torch"

#: Accelerate's ``is_*_available`` checks, evaluated by drivetrain.compat.accelerate_api.availability_checks.
ACCELERATE_AVAILABILITY: dict[str, AvailabilitySpec] = {
    "is_deepspeed_available": AvailabilitySpec(packages=(Package("deepspeed"),)),
    "is_msamp_available": AvailabilitySpec(packages=(Package("msamp", "ms-amp"),)),
    "is_transformer_engine_available": AvailabilitySpec(
        packages=(
            Package("transformer_engine", "transformer-engine"),
            Package("intel_transformer_engine", "intel-transformer-engine"),
        )
    ),
    "is_transformer_engine_mxfp8_available": AvailabilitySpec(
        packages=(Package("transformer_engine", "transformer-engine", "2.1"),)
    ),
    "is_torchao_available": AvailabilitySpec(packages=(Package("torchao", None, "0.6.1"),)),
    "is_fp8_available": AvailabilitySpec(
        any_of=("is_msamp_available", "is_transformer_engine_available", "is_torchao_available")
    ),
    "is_torch_xla_available": AvailabilitySpec(
        packages=(Package("torch_xla"),), env=("USE_TORCH_XLA", "true")
    ),
    "is_megatron_lm_available": AvailabilitySpec(
        packages=(Package("megatron", "megatron-core", "0.8.0"),), env=("ACCELERATE_USE_MEGATRON_LM", "false")
    ),
    "is_mps_available": AvailabilitySpec(device=Device("backends.mps"), min_torch="1.12"),
    "is_xpu_available": AvailabilitySpec(device=Device("xpu"), min_torch="2.7"),
    "is_mlu_available": AvailabilitySpec(device=Device("mlu", "torch_mlu")),
    "is_musa_available": AvailabilitySpec(device=Device("musa", "torch_musa")),
    "is_npu_available": AvailabilitySpec(device=Device("npu", "torch_npu")),
    "is_sdaa_available": AvailabilitySpec(device=Device("sdaa", "torch_sdaa")),
    "is_hpu_available": AvailabilitySpec(device=Device("hpu", _HABANA)),
    "is_habana_gaudi1": AvailabilitySpec(device=Device("hpu", _HABANA), gaudi1=True),
    "is_neuron_available": AvailabilitySpec(device=Device("neuron", "torch_neuronx")),
}

#: The library ``torchao_required`` asks for, and the distributed type ``deepspeed_required`` asks for.
ACCELERATE_LIBRARY_REQUIRED = "is_torchao_available"

ACCELERATE_BACKEND_REQUIRED = "DEEPSPEED"

#: ``get_current_device_type``: the first available of these devices, in Accelerate's order, else CUDA.
ACCELERATE_DEVICE_ORDER = (
    ("is_mlu_available", ("mlu", "MULTI_MLU")),
    ("is_sdaa_available", ("sdaa", "MULTI_SDAA")),
    ("is_musa_available", ("musa", "MULTI_MUSA")),
    ("is_npu_available", ("npu", "MULTI_NPU")),
    ("is_hpu_available", ("hpu", "MULTI_HPU")),
    ("is_xpu_available", ("xpu", "MULTI_XPU")),
    ("is_neuron_available", ("neuron", "MULTI_NEURON")),
)

#: The device beside which a multi-backend quantization library does not train modules offloaded to the CPU
#: (Accelerate's ``prepare_model`` asks ``is_xpu_available()``; drivetrain.training.admission).
QUANTIZED_CPU_EXCLUDED_DEVICE = "xpu"

#: Devices whose ``torch.<attribute>.is_bf16_supported()`` answers ``is_bf16_available`` when available.
ACCELERATE_BF16_DEVICES = (("is_mlu_available", "mlu"), ("is_xpu_available", "xpu"))

#: Accelerate reads this variable once at import (``USE_TORCH_XLA``): the XLA runtime is used unless it is false.
ACCELERATE_RUNTIME_FLAG = ("USE_TORCH_XLA", "true")

#: The check whose device does not support fp16 (``is_fp16_available`` is False there).
ACCELERATE_NO_FP16_DEVICE = "is_habana_gaudi1"
