"""Accelerate's ``accelerate.utils.constants`` that drivetrain's own :mod:`drivetrain.constants` does not hold
(served, with those, at ``drivetrain.utils.constants``): file-name patterns, version thresholds and option lists,
with Accelerate's values (checkpoints and config files interchange). Those that name a backend come from
:data:`drivetrain.compat.paths.ACCELERATE_BACKEND_CONSTANTS`."""

from __future__ import annotations

from typing import Any

from drivetrain.compat import availability, paths
from drivetrain.compat.accelerate_api.versions import OPERATIONS

SAFE_MODEL_NAME = "model"
SAMPLER_NAME = "sampler"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]
DTENSOR_PYTORCH_VERSION = "2.5.0"
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
#: the operators a version requirement may use: the table compare_versions reads
STR_OPERATION_TO_FUNC = OPERATIONS
#: The options of torch's launcher (``torch.distributed.run``) that ``launch`` passes through.
TORCH_LAUNCH_PARAMS = [
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
    "max_restarts", "monitor_interval", "start_method", "role", "module", "m", "no_python", "run_path", "log_dir",
    "r", "redirects", "t", "tee", "node_rank", "master_addr", "master_port",
]  # fmt: skip
#: Distributed types whose collectives go through torch.distributed (Accelerate's list, by enum value).
TORCH_DISTRIBUTED_OPERATION_TYPES = [
    *paths.ACCELERATE_BACKEND_CONSTANTS["CUDA_DISTRIBUTED_TYPES"],
    *(pair[1] for _, pair in availability.ACCELERATE_DEVICE_ORDER if pair[1] != "MULTI_NEURON"),
    "MULTI_CPU",
    "MULTI_NEURON",
]


def _lazy(name: str) -> Any:
    if name in paths.ACCELERATE_BACKEND_CONSTANTS:
        return paths.ACCELERATE_BACKEND_CONSTANTS[name]
    if name == "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING":  # torch.nn only when asked for
        import torch

        return (
            torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d,
            torch.nn.ConvTranspose3d, torch.nn.Linear,
        )  # fmt: skip
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    value = _lazy(name)
    globals()[name] = value  # made once: a constant is the same object at every read
    return value
