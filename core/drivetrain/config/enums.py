"""Enumerations users compare against (``accelerator.distributed_type == DistributedType.MULTI_CPU``)."""

from __future__ import annotations

import enum


class EnumWithContains(enum.EnumMeta):
    """Enum metaclass whose ``in`` accepts values: ``"bf16" in PrecisionType`` (Accelerate's)."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """Accelerate's base enum: ``str(member)`` is its value, ``list()`` lists the values."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [str(member) for member in cls]


class CustomDtype(enum.Enum):
    """Sizes of weights that are no torch dtype, for sizing device maps (``dtype_byte_size``)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


class _StrEnum(str, enum.Enum, metaclass=EnumWithContains):
    """A str-valued enum whose members compare equal to their value (``PrecisionType.BF16 == "bf16"``)."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]


class _NamedStrEnum(str, enum.Enum, metaclass=EnumWithContains):
    """A str-valued enum that prints as ``Class.MEMBER``: Accelerate declares ``DistributedType``,
    ``SageMakerDistributedType`` and ``ComputeEnvironment`` as plain ``(str, Enum)``, so
    ``str(DistributedType.MULTI_CPU)`` is ``'DistributedType.MULTI_CPU'`` there; members still equal their value."""


class DistributedType(_NamedStrEnum):
    """The kind of distributed environment in use; backends report theirs through ``PluginInfo``."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    # Accelerate's old name for XLA.
    TPU = "XLA"


class PrecisionType(_StrEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(_StrEnum):
    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    SDAA = "sdaa"
    MUSA = "musa"
    NEURON = "neuron"
    GENERATOR = "generator"


class LoggerType(_StrEnum):
    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    TRACKIO = "trackio"
    SWANLAB = "swanlab"


class DynamoBackend(_StrEnum):
    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"


class SageMakerDistributedType(_NamedStrEnum):
    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class ComputeEnvironment(_NamedStrEnum):
    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"
