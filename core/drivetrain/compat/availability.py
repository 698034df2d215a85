"""Accelerate's ``is_*_available`` checks, as specifications evaluated by ``drivetrain.utils.imports`` (a check
never imports the library it asks about), and the device facts of Accelerate's utility functions."""

#: Accelerate's ``is_*_available`` checks, evaluated by drivetrain.utils.imports. Keys of a spec:
#: ``packages``: alternatives ``(import name, distribution or None, minimum version or None)``, any installed;
#: ``any_of``: other checks, any true; ``device``: ``(package imported first or None, torch attribute path)``
#: whose ``is_available()`` answers; ``env``: ``(variable, default)`` that must be true; ``torch``: minimum torch.
ACCELERATE_AVAILABILITY: dict[str, dict] = {
    "is_deepspeed_available": {"packages": [("deepspeed", None, None)]},
    "is_msamp_available": {"packages": [("msamp", "ms-amp", None)]},
    "is_transformer_engine_available": {
        "packages": [
            ("transformer_engine", "transformer-engine", None),
            ("intel_transformer_engine", "intel-transformer-engine", None),
        ]
    },
    "is_transformer_engine_mxfp8_available": {
        "packages": [("transformer_engine", "transformer-engine", "2.1")]
    },
    "is_torchao_available": {"packages": [("torchao", None, "0.6.1")]},
    "is_fp8_available": {
        "any_of": ["is_msamp_available", "is_transformer_engine_available", "is_torchao_available"]
    },
    "is_torch_xla_available": {"packages": [("torch_xla", None, None)], "env": ("USE_TORCH_XLA", "true")},
    "is_megatron_lm_available": {
        "packages": [("megatron", "megatron-core", "0.8.0")],
        "env": ("ACCELERATE_USE_MEGATRON_LM", "false"),
    },
    "is_mps_available": {"device": (None, "backends.mps"), "torch": "1.12"},
    "is_xpu_available": {"device": (None, "xpu"), "torch": "2.7"},
    "is_mlu_available": {"device": ("torch_mlu", "mlu")},
    "is_musa_available": {"device": ("torch_musa", "musa")},
    "is_npu_available": {"device": ("torch_npu", "npu")},
    "is_sdaa_available": {"device": ("torch_sdaa", "sdaa")},
    "is_hpu_available": {"device": ("habana_frameworks.torch", "hpu")},
    "is_habana_gaudi1": {"device": ("habana_frameworks.torch", "hpu"), "gaudi1": True},
    "is_neuron_available": {"device": ("torch_neuronx", "neuron")},
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
