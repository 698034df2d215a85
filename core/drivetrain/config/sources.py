"""Where a setting comes from: the script, the environment, or a config file — and what happens when they
disagree.

Sources, highest precedence first:

1. **the script**: ``Accelerator(...)`` / ``PartialState(...)`` arguments and backend-config objects;
2. **the environment**: ``DRIVETRAIN_<NAME>`` variables (``drivetrain launch`` exports its merged flags and
   config file this way);
3. **a config file** named by ``DRIVETRAIN_CONFIG_FILE`` (YAML; see docs/configuration.md);
4. **the default**.

A source only counts when it sets the value. When two sources set different values the kernel raises a
:class:`~drivetrain.errors.ConfigurationError` naming both — a script is never silently overridden.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable
from typing import Any

from drivetrain.errors import ConfigurationError

CONFIG_FILE_ENV = "DRIVETRAIN_CONFIG_FILE"


@dataclasses.dataclass(frozen=True)
class Setting:
    """A resolved value and a human description of where it came from."""

    value: Any
    source: str


def env_name(name: str) -> str:
    return f"DRIVETRAIN_{name.upper()}"


@functools.lru_cache(maxsize=8)
def _read_config_file(path: str, mtime: float) -> dict[str, Any]:
    from drivetrain.config.bounded_yaml import load_mapping

    if not os.path.exists(path):
        raise ConfigurationError(f"config file {path} (from {CONFIG_FILE_ENV}) does not exist")
    return load_mapping(path, f"config file {path} (from {CONFIG_FILE_ENV})")


def config_file_values() -> tuple[str | None, dict[str, Any]]:
    """The config file named by DRIVETRAIN_CONFIG_FILE and its settings (empty when unset)."""
    path = os.environ.get(CONFIG_FILE_ENV)
    if not path:
        return None, {}
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        raise ConfigurationError(f"config file {path} (from {CONFIG_FILE_ENV}) does not exist") from None
    return path, _read_config_file(path, mtime)


def resolve(
    name: str,
    script_value: Any = None,
    *,
    script_source: str | None = None,
    default: Any = None,
    convert: Callable[[Any], Any] = lambda value: value,
    file_key: str | None = None,
) -> Setting:
    """Resolve one setting from the script, ``DRIVETRAIN_<NAME>`` and the config file.

    :param name: the setting's name (``mixed_precision``); the environment variable is derived from it.
    :param script_value: the value the script passed, or None when it passed nothing.
    :param script_source: how to name the script's source in errors (default ``Accelerator(name=...)``).
    :param convert: normalises raw strings from the environment or file (``"2"`` -> ``2``).
    :param file_key: the config file's key when it differs from ``name``.
    """
    candidates: list[Setting] = []
    if script_value is not None:
        candidates.append(
            Setting(convert(script_value), script_source or f"Accelerator({name}={script_value!r})")
        )
    variable = env_name(name)
    if os.environ.get(variable, "") != "":
        candidates.append(
            Setting(convert(os.environ[variable]), f"environment {variable}={os.environ[variable]}")
        )
    path, values = config_file_values()
    key = file_key or name
    if values.get(key) is not None:
        candidates.append(Setting(convert(values[key]), f"config file {path} ({key}: {values[key]})"))
    if not candidates:
        return Setting(default, "default")
    first = candidates[0]
    for other in candidates[1:]:
        if other.value != first.value:
            raise ConfigurationError(
                f"conflicting {name!r}: {first.source} but {other.source}; remove one of them or make them agree"
            )
    return first


def to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigurationError(f"expected a boolean (true/false/1/0), got {value!r}")


def to_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"expected an integer, got {value!r}") from None


#: What ``drivetrain launch`` hands to the processes besides plain settings: the backend's configuration
#: (its config-file section and backend flags) and each plugin's launch options and config keys, as JSON.
BACKEND_CONFIG_ENV = "DRIVETRAIN_BACKEND_CONFIG"
PLUGIN_OPTIONS_ENV = "DRIVETRAIN_PLUGIN_OPTIONS"


def _json_environment(variable: str) -> dict[str, Any]:
    raw = os.environ.get(variable)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"{variable} is not valid JSON ({exc}); it is written by `drivetrain launch`"
        ) from None
    if not isinstance(value, dict):
        raise ConfigurationError(f"{variable} must hold a JSON object, got {type(value).__name__}")
    return value


def launched_backend_config() -> dict[str, Any]:
    """The backend configuration ``drivetrain launch`` handed to this process (config-file section and the
    backend's flags), or ``{}``."""
    return _json_environment(BACKEND_CONFIG_ENV)


def launched_plugin_options() -> dict[str, Any] | None:
    """Every plugin's launch options and config-file keys as ``drivetrain launch`` handed them to this process
    (plugin -> option -> value), or None when the process was not started by it."""
    if not os.environ.get(PLUGIN_OPTIONS_ENV):
        return None
    return _json_environment(PLUGIN_OPTIONS_ENV)
