"""Where a setting comes from: the script, the environment, or a config file — and what happens when they
disagree.

Sources, highest precedence first:

1. **the script**: ``Accelerator(...)`` / ``PartialState(...)`` arguments and backend-config objects;
2. **the environment**: ``DRIVETRAIN_<NAME>`` variables (``drivetrain launch`` exports its merged flags and
   config file this way) and Accelerate's variables for the same settings (``ACCELERATE_MIXED_PRECISION``,
   :data:`ACCELERATE_VARIABLES`);
3. **a config file** named by ``DRIVETRAIN_CONFIG_FILE`` (YAML, checked as ``drivetrain launch --config_file``
   checks it; see docs/configuration.md);
4. **the default**.

A source only counts when it sets the value. When two sources set different values the kernel raises a
:class:`~drivetrain.errors.ConfigurationError` naming both — a script is never silently overridden. Every
boolean setting reads one vocabulary (Accelerate's ``str_to_bool``): :func:`to_bool`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from drivetrain.errors import ConfigurationError

CONFIG_FILE_ENV = "DRIVETRAIN_CONFIG_FILE"

#: The words a boolean setting accepts, in any case (Accelerate's ``str_to_bool``): anything else is an error.
TRUE_WORDS = ("y", "yes", "t", "true", "on", "1")
FALSE_WORDS = ("n", "no", "f", "false", "off", "0")

#: Accelerate's variables for the kernel's settings, read beside ``DRIVETRAIN_<NAME>`` (Accelerate's launcher
#: exports them; scripts written for it set them): setting -> (variable, the values that state no choice).
#: Accelerate's launcher writes ``ACCELERATE_MIXED_PRECISION=no`` and ``ACCELERATE_USE_CPU=False`` whatever was
#: chosen, and a script's own argument wins over them there: such a value conflicts with nothing here either.
ACCELERATE_VARIABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "mixed_precision": ("ACCELERATE_MIXED_PRECISION", ("no",)),
    "gradient_accumulation_steps": ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", ()),
    "cpu": ("ACCELERATE_USE_CPU", FALSE_WORDS),
    "dynamo_backend": ("ACCELERATE_DYNAMO_BACKEND", ("no",)),
    "debug_mode": ("ACCELERATE_DEBUG_MODE", FALSE_WORDS),
}
#: Settings whose config-file key differs from their name.
FILE_KEYS = {"cpu": "use_cpu", "debug_mode": "debug"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """A resolved value and a human description of where it came from."""

    value: Any
    source: str


def env_name(name: str) -> str:
    return f"DRIVETRAIN_{name.upper()}"


def to_bool(value: Any, name: str | None = None) -> bool:
    """``value`` as a boolean: a bool, 0/1, or one of :data:`TRUE_WORDS` / :data:`FALSE_WORDS` in any case.
    Anything else raises a one-line ConfigurationError naming ``name`` (the setting, variable or field)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    shown = f"{name}={value!r}" if name else repr(value)
    raise ConfigurationError(
        f"{shown} is not a boolean; use one of {', '.join(TRUE_WORDS)} (true) or {', '.join(FALSE_WORDS)} (false)"
    )


def env_flag(*variables: str, default: bool = False) -> bool:
    """A boolean switch read from the environment: the first of ``variables`` that is set (empty counts as
    unset), else ``default``. Two variables set to different values are an error naming both."""
    found: list[tuple[str, bool]] = []
    for variable in variables:
        raw = os.environ.get(variable, "").strip()
        if raw:
            found.append((variable, to_bool(raw, f"environment variable {variable}")))
    for variable, value in found[1:]:
        if value != found[0][1]:
            first = found[0][0]
            raise ConfigurationError(
                f"conflicting switches: environment {first}={os.environ[first]} but {variable}="
                f"{os.environ[variable]}; remove one of them or make them agree"
            )
    return found[0][1] if found else default


# -- the config file named by DRIVETRAIN_CONFIG_FILE ---------------------------------------------------------
#: ``check(data, origin) -> (values, format)``: the config file's check, the one ``drivetrain launch
#: --config_file`` applies (``drivetrain.config.file.normalise`` with what the installed plugins declare). The
#: plugin manager (drivetrain.contract, a layer above) registers it with :func:`use_config_file_check`, so
#: that this module imports neither the file format nor the plugins.
_config_file_check: Callable[[dict[str, Any], str], tuple[dict[str, Any], str]] | None = None


def use_config_file_check(check: Callable[[dict[str, Any], str], tuple[dict[str, Any], str]]) -> None:
    global _config_file_check
    _config_file_check = check


@dataclasses.dataclass(frozen=True)
class FileSettings:
    """The config file named by DRIVETRAIN_CONFIG_FILE: its settings, checked and normalised to drivetrain's
    keys, and its format (``"drivetrain"`` or ``"accelerate"``)."""

    path: str
    values: dict[str, Any]
    format: str


@functools.lru_cache(maxsize=8)
def _read_config_file(path: str, mtime: float, size: int) -> dict[str, Any]:
    from drivetrain.config.bounded_yaml import load_mapping

    if not os.path.exists(path):
        raise ConfigurationError(f"config file {path} (from {CONFIG_FILE_ENV}) does not exist")
    return load_mapping(path, f"config file {path} (from {CONFIG_FILE_ENV})")


def config_file() -> FileSettings | None:
    """The config file named by DRIVETRAIN_CONFIG_FILE, checked as ``drivetrain launch --config_file`` checks
    it (an unknown key is the same error), or None when the variable is unset."""
    path = os.environ.get(CONFIG_FILE_ENV)
    if not path:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        raise ConfigurationError(f"config file {path} (from {CONFIG_FILE_ENV}) does not exist") from None
    data = _read_config_file(path, stat.st_mtime, stat.st_size)
    if _config_file_check is None:
        raise RuntimeError(
            "drivetrain.contract.registry registers the config file's check; import drivetrain first"
        )
    values, format_name = _config_file_check(data, f"config file {path}")
    return FileSettings(path=path, values=values, format=format_name)


def config_file_values() -> tuple[str | None, dict[str, Any]]:
    """The config file named by DRIVETRAIN_CONFIG_FILE and its checked settings (empty when unset)."""
    file = config_file()
    if file is None:
        return None, {}
    return file.path, file.values


def _environment_candidates(name: str, convert: Callable[[Any], Any]) -> list[Setting]:
    """What ``DRIVETRAIN_<NAME>`` and Accelerate's variable for ``name`` set (empty values count as unset)."""
    candidates = []
    accelerate, no_choice = ACCELERATE_VARIABLES.get(name, (None, ()))
    for variable in (env_name(name), accelerate):
        raw = os.environ.get(variable, "").strip() if variable else ""
        if not raw or (variable == accelerate and raw.lower() in no_choice):
            continue
        source = f"environment {variable}={raw}"
        candidates.append(Setting(_converted(convert, raw, source), source))
    return candidates


def _converted(convert: Callable[[Any], Any], value: Any, source: str) -> Any:
    try:
        return convert(value)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{source}: {exc}") from None


def resolve(
    name: str,
    script_value: Any = None,
    *,
    script_source: str | None = None,
    default: Any = None,
    convert: Callable[[Any], Any] = lambda value: value,
    file_key: str | None = None,
    environment: Iterable[Setting] = (),
) -> Setting:
    """Resolve one setting from the script, ``DRIVETRAIN_<NAME>`` (and Accelerate's variable for it) and the
    config file.

    :param name: the setting's name (``mixed_precision``); the environment variables are derived from it.
    :param script_value: the value the script passed, or None when it passed nothing.
    :param script_source: how to name the script's source in errors (default ``Accelerator(name=...)``).
    :param convert: normalises raw strings from the environment or file (``"2"`` -> ``2``); a value it refuses
        is an error naming where the value came from.
    :param file_key: the config file's key when it differs from ``name``.
    :param environment: further environment sources of the same setting (already converted).
    """
    candidates: list[Setting] = []
    if script_value is not None:
        source = script_source or f"Accelerator({name}={script_value!r})"
        candidates.append(Setting(_converted(convert, script_value, source), source))
    candidates += _environment_candidates(name, convert)
    candidates += environment
    path, values = config_file_values()
    key = file_key or FILE_KEYS.get(name, name)
    if values.get(key) is not None:
        source = f"config file {path} ({key}: {values[key]})"
        candidates.append(Setting(_converted(convert, values[key], source), source))
    if not candidates:
        return Setting(default, "default")
    first = candidates[0]
    for other in candidates[1:]:
        if other.value != first.value:
            raise ConfigurationError(
                f"conflicting {name!r}: {first.source} but {other.source}; remove one of them or make them agree"
            )
    return first


def to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"expected an integer, got {value!r}")
    try:
        return int(str(value).strip()) if isinstance(value, str) else int(value)
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
