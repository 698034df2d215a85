"""The launch config file: where it lives, what it may hold, reading and writing it.

``drivetrain config`` writes it and ``drivetrain launch`` reads it for every option the command line leaves
unset (flag > config file > default). A file written by HuggingFace Accelerate (``accelerate config``'s
``default_config.yaml``) is accepted too and translated on reading.

The file is YAML, one mapping. See docs/config-file.md for every key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drivetrain.compat.install_hints import ACCELERATE_PLUGIN_KEYS, ACCELERATE_SECTIONS
from drivetrain.config.bounded_yaml import load_mapping, short_repr
from drivetrain.config.enums import DistributedType, PrecisionType
from drivetrain.config.sources import FALSE_WORDS, TRUE_WORDS, to_bool
from drivetrain.errors import ConfigurationError

CONFIG_DIR_ENV = "DRIVETRAIN_CONFIG_DIR"
DEFAULT_CONFIG_NAME = "default_config.yaml"
PRECISIONS = tuple(PrecisionType.list())
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
    try:
        return to_bool(value)
    except ConfigurationError:
        raise ValueError(
            f"expected a boolean: one of {', '.join(TRUE_WORDS)} or {', '.join(FALSE_WORDS)}"
        ) from None


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


def _parallelism(value: Any) -> dict:
    from drivetrain.config.parallelism import check_section

    return check_section(value)


def _dynamo(value: Any) -> str:
    from drivetrain.config.enums import DynamoBackend

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
    "parallelism_config": _parallelism,
    "env": _mapping,
}

# -- Accelerate's default_config.yaml ------------------------------------------------------------------------
#: Accelerate's ``distributed_type`` values that name no backend: several processes select the multi-process
#: backend automatically. The others are answered by the backend whose ``PluginInfo.distributed_type`` they are.
ACCELERATE_AUTOMATIC_TYPES = tuple(
    member.value for member in DistributedType if member.value == "NO" or member.value.startswith("MULTI_")
)
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
#: Accelerate keys that have no effect in drivetrain (SageMaker, affinity, ...) or belong to a plugin that is
#: not installed (compat.install_hints.ACCELERATE_PLUGIN_KEYS): accepted, ignored. A plugin that owns a key reads it.
ACCELERATE_IGNORED_KEYS = (
    "compute_environment",
    "enable_cpu_affinity",
    *ACCELERATE_PLUGIN_KEYS,
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


@dataclasses.dataclass
class PluginDeclarations:
    """What the installed plugins declare about the config file (built by
    ``drivetrain.contract.registry.PluginRegistry.config_declarations``)."""

    #: Accelerate's ``distributed_type`` -> (backend plugin, the section holding its settings or None)
    distributed_types: dict[str, tuple[str, str | None]] = dataclasses.field(default_factory=dict)
    #: top-level keys plugins own -> (plugin, check(value) -> normalised value)
    keys: dict[str, tuple[str, Callable[[Any], Any]]] = dataclasses.field(default_factory=dict)
    #: for the error when no installed plugin answers: Accelerate's ``distributed_type`` -> distribution
    install_hints: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ConfigFile:
    """A config file's settings, normalised to drivetrain's keys."""

    path: Path | None
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
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
        raise ConfigurationError(f"{origin}: {key}: {short_repr(value)} is not valid ({exc})") from None


def _unknown_key(key: str, known: tuple[str, ...] | list[str], origin: str) -> ConfigurationError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigurationError(
        f"{origin}: unknown key {short_repr(key)}{hint} (valid keys: {', '.join(sorted(known))}; see docs/config-file.md)"
    )


def normalise(
    data: dict, origin: str, plugins: PluginDeclarations | None = None
) -> tuple[dict[str, Any], str]:
    """Check a loaded mapping and return (drivetrain values, format). ``origin`` names it in errors. Keys
    that plugins own (``plugins.keys``) are checked by them and collected under ``plugin_options``."""
    plugins = plugins or PluginDeclarations()
    plugin_options = _plugin_keys(data, origin, plugins)
    if not is_accelerate_format(data):
        values = {}
        for key, value in data.items():
            if key in plugins.keys:
                continue
            if key not in KEYS:
                raise _unknown_key(str(key), [*KEYS, *plugins.keys], origin)
            if value is not None:
                values[key] = _checked(key, value, origin)
        format_name = "drivetrain"
    else:
        values, format_name = _from_accelerate(data, origin, plugins), "accelerate"
    if plugin_options:
        values["plugin_options"] = plugin_options
    return values, format_name


def _plugin_keys(data: dict, origin: str, plugins: PluginDeclarations) -> dict[str, dict[str, Any]]:
    """The values of keys plugins own, checked by them, by plugin."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key not in plugins.keys or value is None:
            continue
        plugin, check = plugins.keys[key]
        try:
            checked = check(value)
        except ValueError as exc:
            raise ConfigurationError(f"{origin}: {key}: {short_repr(value)} is not valid ({exc})") from None
        if checked is not None:  # None: a value that states no choice (one Accelerate always writes)
            found.setdefault(plugin, {})[key] = checked
    return found


def _from_accelerate(data: dict, origin: str, plugins: PluginDeclarations) -> dict[str, Any]:
    sections = {section for _, section in plugins.distributed_types.values() if section}
    known = (
        *ACCELERATE_SHARED_KEYS,
        *ACCELERATE_IGNORED_KEYS,
        *ACCELERATE_SECTIONS,
        "parallelism_config",
        *sections,
        *plugins.keys,
    )
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
    if distributed_type not in ACCELERATE_AUTOMATIC_TYPES:
        if distributed_type not in plugins.distributed_types:
            hint = plugins.install_hints.get(distributed_type)
            if hint is not None:
                raise ConfigurationError(
                    f"{origin}: distributed_type {distributed_type} needs a plugin that is not installed: "
                    f"pip install {hint}"
                )
            valid = [*ACCELERATE_AUTOMATIC_TYPES, *plugins.distributed_types]
            raise ConfigurationError(
                f"{origin}: distributed_type: {short_repr(distributed_type)} is not valid (expected one of: "
                f"{', '.join(valid)})"
            )
        backend, section = plugins.distributed_types[distributed_type]
        values["backend"] = backend
        if section and data.get(section):
            values["backend_config"] = _checked("backend_config", data[section], origin)
    if data.get("parallelism_config"):
        values["parallelism_config"] = _checked("parallelism_config", data["parallelism_config"], origin)
    dynamo_config = data.get("dynamo_config") or {}
    if not isinstance(dynamo_config, dict):
        raise ConfigurationError(
            f"{origin}: dynamo_config: {short_repr(dynamo_config)} is not valid (expected a mapping)"
        )
    dynamo = dynamo_config.get("dynamo_backend")
    if dynamo and str(dynamo).upper() != "NO":
        values["dynamo_backend"] = _checked("dynamo_backend", dynamo, origin)
    return values


def load_config(
    path: str | os.PathLike | None = None,
    *,
    required: bool = False,
    plugins: PluginDeclarations | Callable[[], PluginDeclarations] | None = None,
) -> ConfigFile:
    """Read ``path`` (default: the user's default config file). A missing default file is an empty config;
    a missing named file is an error. ``plugins`` (or a function returning them, called only when there is
    a file to read) says what installed plugins declare."""
    explicit = path is not None
    file = Path(path).expanduser() if path is not None else default_config_path()
    if not file.exists():
        if explicit or required:
            raise ConfigurationError(
                f"config file {file} does not exist; create it with `drivetrain config --config_file {file}`"
            )
        return ConfigFile(path=None)
    data = load_mapping(file, f"config file {file}")  # bounded: size, depth, aliases (see bounded_yaml)
    declarations = plugins() if callable(plugins) else plugins
    values, format_name = normalise(data, f"config file {file}", declarations)
    return ConfigFile(path=file, values=values, format=format_name)


def save_config(
    values: dict[str, Any], path: str | os.PathLike | None = None, plugins: PluginDeclarations | None = None
) -> Path:
    """Check ``values`` and write them as drivetrain's format (keys in a stable order, then the keys plugins
    own); return the path. ``values`` may hold a ``plugin_options`` mapping (as :func:`load_config` returns)."""
    import yaml

    file = Path(path).expanduser() if path is not None else default_config_path()
    values = dict(values)
    owned = {
        key: value for options in values.pop("plugin_options", {}).values() for key, value in options.items()
    }
    checked, _ = normalise({**values, **owned}, "config", plugins)
    ordered = {key: checked[key] for key in KEYS if key in checked}
    for options in checked.get("plugin_options", {}).values():
        ordered.update(options)
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
