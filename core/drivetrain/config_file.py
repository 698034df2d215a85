"""The launch config file: where it lives, what it may hold, reading and writing it.

``drivetrain config`` writes it and ``drivetrain launch`` reads it for every option the command line leaves
unset (flag > config file > default). A file written by HuggingFace Accelerate (``accelerate config``'s
``default_config.yaml``) is accepted too and translated on reading.

The file is YAML, one mapping. See docs/config-file.md for every key.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from drivetrain.errors import ConfigurationError

CONFIG_DIR_ENV = "DRIVETRAIN_CONFIG_DIR"
DEFAULT_CONFIG_NAME = "default_config.yaml"
PRECISIONS = ("no", "fp16", "bf16", "fp8")
RDZV_BACKENDS = ("static", "c10d")


def config_dir() -> Path:
    """``$DRIVETRAIN_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/drivetrain``, else ``~/.config/drivetrain``."""
    if os.environ.get(CONFIG_DIR_ENV):
        return Path(os.environ[CONFIG_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "drivetrain"


def default_config_path() -> Path:
    return config_dir() / DEFAULT_CONFIG_NAME


# -- value checks: each returns the normalised value or raises ValueError with what is valid ---------------
def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise ValueError("expected a whole number >= 1")
    number = int(value)
    if number < 1:
        raise ValueError("expected a whole number >= 1")
    return number


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise ValueError("expected a whole number >= 0")
    return int(value)


def _port(value: Any) -> int:
    number = _non_negative_int(value)
    if not 0 < number < 65536:
        raise ValueError("expected a port number between 1 and 65535")
    return number


def _positive_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number of seconds > 0") from None
    if number <= 0:
        raise ValueError("expected a number of seconds > 0")
    return number


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "y", "on"):
        return True
    if text in ("0", "false", "no", "n", "off"):
        return False
    raise ValueError("expected true or false")


def _choice(*choices: str, lower: bool = True) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = str(value).strip()
        text = text.lower() if lower else text.upper()
        if text not in choices:
            raise ValueError(f"expected one of: {', '.join(choices)}")
        return text

    return check


def _text(value: Any) -> str:
    if not isinstance(value, (str, int, float)) or str(value).strip() == "":
        raise ValueError("expected a non-empty string")
    return str(value).strip()


def _mapping(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError("expected a mapping (key: value lines)")
    return dict(value)


def _dynamo(value: Any) -> str:
    from drivetrain.enums import DynamoBackend

    return _choice(*DynamoBackend.list(), lower=False)(value)


#: drivetrain's keys -> check. Every key is optional; a missing key means "not chosen" (the script decides).
KEYS: dict[str, Callable[[Any], Any]] = {
    "backend": _text,
    "num_processes": _positive_int,
    "num_machines": _positive_int,
    "machine_rank": _non_negative_int,
    "main_process_ip": _text,
    "main_process_port": _port,
    "rdzv_backend": _choice(*RDZV_BACKENDS),
    "rdzv_conf": _text,
    "max_restarts": _non_negative_int,
    "monitor_interval": _positive_float,
    "same_network": _bool,
    "mixed_precision": _choice(*PRECISIONS),
    "use_cpu": _bool,
    "gpu_ids": _text,
    "num_cpu_threads_per_process": _positive_int,
    "gradient_accumulation_steps": _positive_int,
    "dynamo_backend": _dynamo,
    "debug": _bool,
    "backend_config": _mapping,
    "env": _mapping,
}

# -- Accelerate's default_config.yaml ------------------------------------------------------------------------
#: Accelerate's ``distributed_type`` -> the drivetrain plugin that provides it and the section holding its
#: settings. ``MULTI_*`` needs no name: several processes select the multi-process backend automatically.
ACCELERATE_DISTRIBUTED_TYPES: dict[str, tuple[str | None, str | None]] = {
    "NO": (None, None),
    "MULTI_CPU": (None, None),
    "MULTI_GPU": (None, None),
    "MULTI_XPU": (None, None),
    "MULTI_NPU": (None, None),
    "MULTI_MLU": (None, None),
    "MULTI_HPU": (None, None),
    "MULTI_SDAA": (None, None),
    "MULTI_MUSA": (None, None),
    "DEEPSPEED": ("deepspeed", "deepspeed_config"),
    "FSDP": ("fsdp", "fsdp_config"),
    "MEGATRON_LM": ("megatron", "megatron_lm_config"),
    "XLA": ("xla", None),
    "TPU": ("xla", None),
}
#: Accelerate keys read as they are (same meaning in drivetrain).
ACCELERATE_SHARED_KEYS = (
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "rdzv_backend",
    "same_network",
    "mixed_precision",
    "use_cpu",
    "gpu_ids",
    "debug",
    "gradient_accumulation_steps",
)
#: Accelerate keys that have no effect in drivetrain (TPU pods, SageMaker, affinity, ...): accepted, ignored.
ACCELERATE_IGNORED_KEYS = (
    "compute_environment",
    "main_training_function",
    "downcast_bf16",
    "enable_cpu_affinity",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "tpu_name",
    "tpu_zone",
    "commands",
    "command_file",
    "ipex_config",
    "mpirun_config",
    "fp8_config",
    "parallelism_config",
    "use_xpu",
    "deepspeed_config",
    "fsdp_config",
    "megatron_lm_config",
    "dynamo_config",
    "distributed_type",
    "ec2_instance_type",
    "iam_role_name",
    "profile",
    "region",
    "num_cpu_threads_per_process",
    "sagemaker_inputs_file",
    "sagemaker_metrics_file",
    "additional_args",
    "pytorch_version",
    "transformers_version",
    "py_version",
    "base_job_name",
)
#: Values Accelerate always writes; they state no choice, so a script's own argument must not conflict
#: with them (Accelerate lets the script win; drivetrain would raise).
_ACCELERATE_NO_CHOICE = {"mixed_precision": "no", "use_cpu": False, "debug": False}


@attrs.define
class ConfigFile:
    """A config file's settings, normalised to drivetrain's keys."""

    path: Path | None
    values: dict[str, Any] = attrs.Factory(dict)
    #: "drivetrain" or "accelerate"
    format: str = "drivetrain"

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None else value


def is_accelerate_format(data: dict) -> bool:
    return "compute_environment" in data or "distributed_type" in data


def _checked(key: str, value: Any, origin: str) -> Any:
    try:
        return KEYS[key](value)
    except ValueError as exc:
        raise ConfigurationError(f"{origin}: {key}: {value!r} is not valid ({exc})") from None


def _unknown_key(key: str, known: tuple[str, ...] | list[str], origin: str) -> ConfigurationError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigurationError(
        f"{origin}: unknown key {key!r}{hint} (valid keys: {', '.join(sorted(known))}; see docs/config-file.md)"
    )


def normalise(data: dict, origin: str) -> tuple[dict[str, Any], str]:
    """Check a loaded mapping and return (drivetrain values, format). ``origin`` names it in errors."""
    if not is_accelerate_format(data):
        values = {}
        for key, value in data.items():
            if key not in KEYS:
                raise _unknown_key(str(key), list(KEYS), origin)
            if value is not None:
                values[key] = _checked(key, value, origin)
        return values, "drivetrain"
    return _from_accelerate(data, origin), "accelerate"


def _from_accelerate(data: dict, origin: str) -> dict[str, Any]:
    known = (*ACCELERATE_SHARED_KEYS, *ACCELERATE_IGNORED_KEYS)
    for key in data:
        if key not in known:
            raise _unknown_key(str(key), known, f"{origin} (Accelerate format)")
    values: dict[str, Any] = {}
    for key in ACCELERATE_SHARED_KEYS:
        value = data.get(key)
        if value is None or (key == "gpu_ids" and str(value) == "all"):
            continue
        checked = _checked(key, value, origin)
        if _ACCELERATE_NO_CHOICE.get(key, object()) == checked:
            continue
        values[key] = checked
    distributed_type = str(data.get("distributed_type") or "NO").upper()
    if distributed_type not in ACCELERATE_DISTRIBUTED_TYPES:
        raise ConfigurationError(
            f"{origin}: distributed_type: {distributed_type!r} is not valid (expected one of: "
            f"{', '.join(ACCELERATE_DISTRIBUTED_TYPES)})"
        )
    backend, section = ACCELERATE_DISTRIBUTED_TYPES[distributed_type]
    if backend is not None:
        values["backend"] = backend
    if section and data.get(section):
        values["backend_config"] = _checked("backend_config", data[section], origin)
    dynamo = (data.get("dynamo_config") or {}).get("dynamo_backend")
    if dynamo and str(dynamo).upper() != "NO":
        values["dynamo_backend"] = _checked("dynamo_backend", dynamo, origin)
    return values


def load_config(path: str | os.PathLike | None = None, *, required: bool = False) -> ConfigFile:
    """Read ``path`` (default: the user's default config file). A missing default file is an empty config;
    a missing named file is an error."""
    explicit = path is not None
    file = Path(path).expanduser() if explicit else default_config_path()
    if not file.exists():
        if explicit or required:
            raise ConfigurationError(
                f"config file {file} does not exist; create it with `drivetrain config --config_file {file}`"
            )
        return ConfigFile(path=None)
    import yaml  # only with a file to read: `drivetrain launch` without one starts sooner

    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        problem = str(exc).replace("\n", " ")
        raise ConfigurationError(f"config file {file} is not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"config file {file} must hold a mapping of settings, not {type(data).__name__}"
        )
    values, format_name = normalise(data, f"config file {file}")
    return ConfigFile(path=file, values=values, format=format_name)


def save_config(values: dict[str, Any], path: str | os.PathLike | None = None) -> Path:
    """Check ``values`` and write them as drivetrain's format (keys in a stable order); return the path."""
    import yaml

    file = Path(path).expanduser() if path is not None else default_config_path()
    checked, _ = normalise(values, "config")
    ordered = {key: checked[key] for key in KEYS if key in checked}
    file.parent.mkdir(parents=True, exist_ok=True)
    temporary = file.with_name(file.name + ".tmp")
    temporary.write_text(yaml.safe_dump(ordered, sort_keys=False), encoding="utf-8")
    os.replace(temporary, file)
    return file


def write_basic_config(
    mixed_precision: str = "no", save_location: str | os.PathLike | None = None
) -> Path | bool:
    """Write a config file for this machine (every visible GPU, or one CPU process) unless one exists.

    Returns the path written, or False when a file is already there (as Accelerate's does).
    """
    file = Path(save_location).expanduser() if save_location is not None else default_config_path()
    if file.exists():
        return False
    return save_config(basic_config(mixed_precision), file)


def basic_config(mixed_precision: str = "no") -> dict[str, Any]:
    """The settings ``drivetrain config default`` writes: process count from the hardware, and the
    precision only when one was asked for (a value that equals the default would override scripts)."""
    import torch

    values: dict[str, Any] = {}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    values["num_processes"] = max(gpus, 1)
    if gpus == 0:
        values["use_cpu"] = True
    precision = _choice(*PRECISIONS)(mixed_precision)
    if precision != "no":
        values["mixed_precision"] = precision
    return values
