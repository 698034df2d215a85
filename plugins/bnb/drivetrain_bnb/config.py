"""``BnbQuantizationConfig``: which bitsandbytes quantization ``load_and_quantize_model`` applies.

The fields, defaults and normalisations are Accelerate's (``accelerate.utils.BnbQuantizationConfig``): exactly one
of ``load_in_8bit`` / ``load_in_4bit``, dtypes given as ``"fp32"``/``"fp16"``/``"bf16"`` or as a
``torch.dtype``, ``torch_dtype`` defaulting to float16 for 8-bit and to the compute dtype for 4-bit. A bad value
raises a ``ValueError`` (drivetrain's ``ConfigurationError``) naming the field and what it accepts. Building one
never imports bitsandbytes.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.big_model import CustomDtype

#: The dtype names the string-valued dtype fields accept.
DTYPE_NAMES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: bitsandbytes' 4-bit data types.
QUANT_TYPES = ("fp4", "nf4")
#: llm_int8_threshold's default; another value only means something for 8-bit.
DEFAULT_INT8_THRESHOLD = 6.0


def _invalid(field: str, value: Any, valid: str) -> ConfigurationError:
    return ConfigurationError(f"BnbQuantizationConfig.{field}={value!r} is not valid; {valid}")


def _dtype(field: str, value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value in DTYPE_NAMES:
        return DTYPE_NAMES[value]
    raise _invalid(field, value, f"use one of {sorted(DTYPE_NAMES)} or a torch.dtype")


@dataclasses.dataclass
class BnbQuantizationConfig:
    """How to quantize a model's ``torch.nn.Linear`` layers with bitsandbytes.

    ``load_in_8bit``: LLM.int8() layers (``bnb.nn.Linear8bitLt``); ``llm_int8_threshold`` is their outlier
    threshold. ``load_in_4bit``: 4-bit layers (``bnb.nn.Linear4bit``) of ``bnb_4bit_quant_type`` (``"fp4"`` or
    ``"nf4"``), computing in ``bnb_4bit_compute_dtype``, with the quantization constants quantized again when
    ``bnb_4bit_use_double_quant``. ``torch_dtype`` is the dtype of the layers left unquantized;
    ``skip_modules`` are not quantized (kept in ``torch_dtype``; default: the output head and tied weights, see
    ``get_keys_to_not_convert``); ``keep_in_fp32_modules`` are not quantized and kept in float32.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = DEFAULT_INT8_THRESHOLD
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    def __post_init__(self) -> None:
        for field in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, field), bool):
                raise _invalid(field, getattr(self, field), "use True or False")
        if self.load_in_8bit and self.load_in_4bit:
            raise ConfigurationError(
                "BnbQuantizationConfig: load_in_8bit and load_in_4bit are both True; set exactly one of them"
            )
        if not self.load_in_8bit and not self.load_in_4bit:
            raise ConfigurationError(
                "BnbQuantizationConfig: load_in_8bit and load_in_4bit are both False; set exactly one of them"
            )
        if isinstance(self.llm_int8_threshold, bool) or not isinstance(self.llm_int8_threshold, int | float):
            raise _invalid("llm_int8_threshold", self.llm_int8_threshold, "use a number (default 6.0)")
        if self.bnb_4bit_quant_type not in QUANT_TYPES:
            raise _invalid("bnb_4bit_quant_type", self.bnb_4bit_quant_type, f"use one of {list(QUANT_TYPES)}")
        self.bnb_4bit_compute_dtype = _dtype("bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype)
        for field in ("skip_modules", "keep_in_fp32_modules"):
            value = getattr(self, field)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(name, str) for name in value)
            ):
                raise _invalid(field, value, "use a list of module names (strings) or None")
        #: The size of a quantized weight, for device maps (``infer_auto_device_map(dtype=...)``).
        self.target_dtype: torch.dtype | CustomDtype = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != DEFAULT_INT8_THRESHOLD:
            warnings.warn(
                "BnbQuantizationConfig.llm_int8_threshold only applies to 8-bit quantization; it is ignored "
                "with load_in_4bit=True",
                stacklevel=3,
            )
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _dtype("torch_dtype", self.torch_dtype)
