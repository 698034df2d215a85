"""Accelerate's ``accelerate.utils.imports`` (served at ``drivetrain.utils.imports``): the ``is_*_available``
family, answered from what is installed and what torch reports, without importing the library asked about (a
check must stay cheap).

The checks that name a library or device are specified in :data:`drivetrain.compat.availability.ACCELERATE_AVAILABILITY`
(the kernel names no backend elsewhere); this module evaluates them. Every check accepts and ignores the keyword
arguments Accelerate's variants take (``check_device=``, ``min_version=``...), except where noted.
Accelerate's ``is_bitsandbytes_multi_backend_available`` is :func:`drivetrain.training.admission.quantization_computes_on_cpu`
(``prepare`` asks it), served from there.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as importlib_metadata
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from drivetrain.compat import availability
from drivetrain.compat.accelerate_api.versions import compare_versions, is_torch_version
from drivetrain.config.sources import env_flag, to_bool


def package_available(
    import_name: str, distribution: str | None = None, min_version: str | None = None
) -> bool:
    """Whether ``import_name`` can be imported and its distribution is installed (a bare folder of that name on
    ``sys.path`` is not the library), at ``min_version`` or newer when given."""
    try:
        if importlib.util.find_spec(import_name) is None:
            return False
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False
    try:
        installed = importlib_metadata.version(distribution or import_name.partition(".")[0])
    except importlib_metadata.PackageNotFoundError:
        return False
    from packaging.version import parse

    return min_version is None or compare_versions(parse(installed), ">=", min_version)


def _device_available(device: availability.Device) -> bool:
    import torch

    package = device.package
    if package is not None:
        if importlib.util.find_spec(package.partition(".")[0]) is None:
            return False
        try:
            importlib.import_module(package)
        except Exception:  # a device library that fails to import (no driver) means no device
            return False
    module: Any = torch
    for part in device.attribute.split("."):
        module = getattr(module, part, None)
        if module is None:
            return False
    try:
        return bool(module.is_available())
    except RuntimeError:
        return False


@functools.cache
def _evaluate(name: str) -> bool:
    spec = availability.ACCELERATE_AVAILABILITY[name]
    if spec.env is not None:
        variable, default = spec.env
        if not env_flag(variable, default=to_bool(default)):
            return False
    if spec.min_torch is not None and not is_torch_version(">=", spec.min_torch):
        return False
    if spec.packages and not any(
        package_available(package.import_name, package.distribution, package.min_version)
        for package in spec.packages
    ):
        return False
    if spec.any_of and not any(_evaluate(other) for other in spec.any_of):
        return False
    if spec.device is not None and not _device_available(spec.device):
        return False
    if spec.gaudi1:
        try:
            experimental = importlib.import_module("habana_frameworks.torch.utils.experimental")
            return experimental._get_device_type() == experimental.synDeviceType.synDeviceGaudi
        except Exception:
            return False
    return True


@functools.cache
def _plugin_check(name: str) -> Callable[..., bool] | None:
    """The installed plugin's own check of this name (``drivetrain.exports``), which knows its device (the xla
    plugin answers ``check_is_tpu``), or None when no installed plugin exports it."""
    from drivetrain.contract.exports import resolve_export

    try:
        return resolve_export(name)
    except (ImportError, AttributeError):
        return None


def _check(name: str) -> Callable[..., bool]:
    def check(*args: Any, **kwargs: Any) -> bool:
        provided = _plugin_check(name)
        if provided is not None:
            return bool(provided(*args, **kwargs))
        return _evaluate(name)

    check.__name__ = check.__qualname__ = name
    check.__doc__ = f"Accelerate's ``{name}``: see drivetrain.compat.availability.ACCELERATE_AVAILABILITY."
    return check


def _library(
    import_name: str, distribution: str | None = None, min_version: str | None = None
) -> Callable[[], bool]:
    def check(*args: Any, **kwargs: Any) -> bool:
        return package_available(import_name, distribution, min_version)

    return check


# Libraries that are not backends (the checks that name a backend live in the names table).
is_import_timer_available = _library("import_timer")
is_amdsmi_available = _library("amdsmi")
is_pytest_available = _library("pytest")
is_schedulefree_available = _library("schedulefree")
is_lomo_available = _library("lomo_optim")
is_torchvision_available = _library("torchvision")
is_transformers_available = _library("transformers")
is_datasets_available = _library("datasets")
is_peft_available = _library("peft")
is_timm_available = _library("timm")
is_triton_available = _library("triton")
is_wandb_available = _library("wandb")
is_comet_ml_available = _library("comet_ml")
is_swanlab_available = _library("swanlab")
is_boto3_available = _library("boto3")
is_sagemaker_available = _library("sagemaker")
is_tqdm_available = _library("tqdm")
is_clearml_available = _library("clearml")
is_pandas_available = _library("pandas")
is_matplotlib_available = _library("matplotlib")
is_dvclive_available = _library("dvclive")
is_torchdata_available = _library("torchdata")
is_torchdata_stateful_dataloader_available = _library("torchdata", None, "0.8.0")
is_4bit_bnb_available = _library("bitsandbytes", None, "0.39.0")
is_8bit_bnb_available = _library("bitsandbytes", None, "0.37.2")


def is_pynvml_available() -> bool:
    return package_available("pynvml") or package_available("pynvml", "nvidia-ml-py")


def is_tensorboard_available() -> bool:
    return package_available("tensorboard") or package_available("tensorboardX")


def is_aim_available() -> bool:
    return package_available("aim")


def is_mlflow_available() -> bool:
    return package_available("mlflow") or package_available("mlflow", "mlflow-skinny")


def is_trackio_available() -> bool:
    return sys.version_info >= (3, 10) and package_available("trackio")


def is_rich_available() -> bool:
    """Installed, and not switched off with ``ACCELERATE_DISABLE_RICH``."""
    return package_available("rich") and not env_flag("ACCELERATE_DISABLE_RICH")


def is_bnb_available(min_version: str | None = None) -> bool:
    return package_available("bitsandbytes", None, min_version)


def is_torch_distributed_available() -> bool:
    import torch.distributed

    return torch.distributed.is_available()


def is_xccl_available() -> bool:
    import torch.distributed

    check = getattr(torch.distributed.distributed_c10d, "is_xccl_available", None)
    return bool(check()) if check is not None else False


def is_rocm_available() -> bool:
    import torch

    return torch.version.hip is not None


def is_weights_only_available() -> bool:
    return is_torch_version(">=", "2.4.0")


def is_pippy_available() -> bool:
    return is_torch_version(">=", "2.4.0")


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    return package_available("numpy", None, min_version)


def is_cuda_available() -> bool:
    """torch's NVML-based check, which leaves CUDA uninitialised (a forked worker can still use it)."""
    import torch

    from drivetrain.config.environment_variables import patch_environment

    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        return torch.cuda.is_available()


def is_bf16_available(*args: Any, **kwargs: Any) -> bool:
    """Whether the device in use computes in bfloat16 (CPU always does)."""
    import torch

    if is_cuda_available():
        return torch.cuda.is_bf16_supported()
    for check, attribute in availability.ACCELERATE_BF16_DEVICES:
        if _evaluate(check):
            return bool(getattr(torch, attribute).is_bf16_supported())
    return True


def is_fp16_available() -> bool:
    return not _evaluate(availability.ACCELERATE_NO_FP16_DEVICE)


def library_required(function: Callable) -> Callable:
    """Accelerate's ``torchao_required``: ``function`` raises an ImportError saying what to install when the
    library is missing."""
    check = availability.ACCELERATE_LIBRARY_REQUIRED

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _evaluate(check):
            library = check.removeprefix("is_").removesuffix("_available")
            raise ImportError(f"{function.__name__} needs {library}: pip install {library}")
        return function(*args, **kwargs)

    return wrapper


def backend_required(function: Callable) -> Callable:
    """Accelerate's ``deepspeed_required``: ``function`` raises a ValueError when an Accelerator is set up for
    another backend."""
    backend = availability.ACCELERATE_BACKEND_REQUIRED

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from drivetrain.state import AcceleratorState

        if AcceleratorState._shared_state and str(AcceleratorState().distributed_type.value) != backend:
            raise ValueError(f"{function.__name__} needs an Accelerator set up for {backend.lower()}")
        return function(*args, **kwargs)

    return wrapper


#: Accelerate reads this once at import (its name: :data:`drivetrain.compat.availability.ACCELERATE_RUNTIME_FLAG`).
use_accelerator_runtime = env_flag(
    availability.ACCELERATE_RUNTIME_FLAG[0], default=to_bool(availability.ACCELERATE_RUNTIME_FLAG[1])
)

# the checks specified in the table (a plugin that exports one of these names answers instead)
for _name in availability.ACCELERATE_AVAILABILITY:
    globals().setdefault(_name, _check(_name))
