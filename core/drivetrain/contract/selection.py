"""Which plugins run: the distribution backend (and where that choice came from) and the precision plugin.

The sources of a setting and their precedence are in :mod:`drivetrain.config.sources`; two sources that
disagree raise a :class:`~drivetrain.errors.ConfigurationError` naming both.
"""

from __future__ import annotations

from typing import Any

from drivetrain.compat.names import MULTIPROCESS_BACKEND_DISTRIBUTION, PRECISION_DISTRIBUTIONS
from drivetrain.config import sources
from drivetrain.contract.environment import environment_world_size
from drivetrain.contract.info import REFERENCE_BACKEND
from drivetrain.contract.manager import PluginManager
from drivetrain.errors import ConfigurationError, PluginError

#: How ``select_backend`` describes a backend nobody asked for (the device may still pick another one).
AUTOMATIC_SOURCES = ("default", "automatic")
#: precisions every backend handles through torch's autocast; others need a precision plugin
BUILTIN_PRECISIONS = ("no", "fp16", "bf16")


def backend_of_config(config: Any) -> str:
    """The plugin name a backend-config object belongs to (its class attribute ``backend_name``)."""
    name = getattr(config, "backend_name", None)
    if not isinstance(name, str):
        raise ConfigurationError(
            f"{type(config).__name__} is not a backend configuration: it has no 'backend_name' attribute "
            "(backend configuration classes are provided by backend plugins, e.g. FullyShardedDataParallelPlugin)"
        )
    return name


def select_backend(manager: PluginManager, backend: str | None, backend_config: Any) -> sources.Setting:
    """Decide the distribution backend and check that it is one."""
    chosen = _chosen_backend(manager, backend, backend_config)
    kind = manager.info(chosen.value).kind
    if kind != "backend":
        raise PluginError(
            f"plugin {chosen.value!r} (from {chosen.source}) is a {kind} plugin, not a distribution backend; "
            f"backends installed: {', '.join(manager.plugins_of_kind('backend'))}"
        )
    return chosen


def _chosen_backend(manager: PluginManager, backend: str | None, backend_config: Any) -> sources.Setting:
    script_value, script_source = backend, f"Accelerator(backend={backend!r})" if backend else None
    if backend_config is not None:
        implied = backend_of_config(backend_config)
        if backend is not None and backend != implied:
            raise ConfigurationError(
                f"conflicting 'backend': Accelerator(backend={backend!r}) but the configuration object "
                f"{type(backend_config).__name__} belongs to backend {implied!r}"
            )
        script_value, script_source = implied, f"{type(backend_config).__name__} passed to the Accelerator"
    chosen = sources.resolve("backend", script_value, script_source=script_source, default=None)
    if chosen.value is not None:
        return chosen
    world_size = environment_world_size()
    if world_size <= 1:
        return sources.Setting(REFERENCE_BACKEND, f"{AUTOMATIC_SOURCES[0]} (one process)")
    automatic = manager.multiprocess_backend()
    if automatic is None:
        raise PluginError(
            f"this script runs in {world_size} processes (WORLD_SIZE={world_size}) but no installed backend "
            f"handles several processes (installed: {', '.join(manager.names())}); "
            f"install one with: pip install {MULTIPROCESS_BACKEND_DISTRIBUTION}"
        )
    return sources.Setting(automatic, f"{AUTOMATIC_SOURCES[1]} ({world_size} processes)")


def precision_plugin(manager: PluginManager, mixed_precision: str) -> str | None:
    """The plugin that provides ``mixed_precision`` (``"fp8"``), None for the built-in precisions. Raises a
    PluginError naming what to install when none is installed."""
    if mixed_precision in BUILTIN_PRECISIONS:
        return None
    providers = [name for name, info in manager.loadable() if mixed_precision in info.precisions]
    if not providers:
        distribution = PRECISION_DISTRIBUTIONS.get(mixed_precision, f"drivetrain-{mixed_precision}")
        raise PluginError(
            f"mixed_precision={mixed_precision!r} needs a precision plugin; none is installed "
            f"(pip install {distribution})"
        )
    return providers[0]


def backend_settings(manager: PluginManager, backend: str) -> tuple[str | None, dict[str, Any]]:
    """(where they come from, the settings) of backend ``backend`` when the script passed no configuration
    object: what ``drivetrain launch`` handed over (its flags and config file), else the config file named
    by ``DRIVETRAIN_CONFIG_FILE`` — Accelerate's section for the backend (``PluginInfo.config_section``) or
    drivetrain's ``backend_config`` when ``backend:`` names it. ``(None, {})`` when there are none."""
    launched = sources.launched_backend_config()
    if launched:
        return f"environment {sources.BACKEND_CONFIG_ENV}", launched
    path, data = sources.config_file_values()
    if path is None:
        return None, {}
    section = manager.info(backend).config_section
    if section and section in data:
        values, origin = data.get(section) or {}, f"config file {path}, section {section}"
    elif str(data.get("backend", "")).lower() == backend:
        values, origin = data.get("backend_config") or {}, f"config file {path}, section backend_config"
    else:
        return None, {}
    if not isinstance(values, dict):
        raise ConfigurationError(f"{origin}: expected a mapping of settings, got {type(values).__name__}")
    return origin, dict(values)


def plugin_options(manager: PluginManager, plugin: str) -> dict[str, Any]:
    """Plugin ``plugin``'s launch options and config-file keys: what ``drivetrain launch`` handed to this
    process, else the keys it claimed (``registry.add_config_keys``) in the config file named by
    ``DRIVETRAIN_CONFIG_FILE``, checked by the plugin. ``{}`` when there are none."""
    launched = sources.launched_plugin_options()
    if launched is not None:
        options = launched.get(plugin, {})
        return dict(options) if isinstance(options, dict) else {}
    path, data = sources.config_file_values()
    found: dict[str, Any] = {}
    for key, (owner, check) in manager.extensions.config_keys.items():
        if owner == plugin and data.get(key) is not None:
            try:
                checked = check(data[key])
            except ValueError as exc:
                raise ConfigurationError(
                    f"config file {path}: {key}: {data[key]!r} is not valid ({exc})"
                ) from None
            if checked is not None:  # None: a value that states no choice
                found[key] = checked
    return found
