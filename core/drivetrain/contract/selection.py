"""Which plugins run: the distribution backend (and where that choice came from) and the precision plugin.

The sources of a setting and their precedence are in :mod:`drivetrain.config.sources`; two sources that
disagree raise a :class:`~drivetrain.errors.ConfigurationError` naming both.
"""

from __future__ import annotations

import os
from typing import Any

from drivetrain.compat.distributions import MULTIPROCESS_BACKEND_DISTRIBUTION
from drivetrain.compat.install_hints import ACCELERATE_BACKEND_FLAGS, PRECISION_DISTRIBUTIONS
from drivetrain.config import sources
from drivetrain.contract.environment import environment_world_size
from drivetrain.contract.info import REFERENCE_BACKEND
from drivetrain.contract.registry import PluginRegistry
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


def select_backend(manager: PluginRegistry, backend: str | None, backend_config: Any) -> sources.Setting:
    """Decide the distribution backend and check that it is one."""
    chosen = _chosen_backend(manager, backend, backend_config)
    kind = manager.info(chosen.value).kind
    if kind != "backend":
        raise PluginError(
            f"plugin {chosen.value!r} (from {chosen.source}) is a {kind} plugin, not a distribution backend; "
            f"backends installed: {', '.join(manager.plugins_of_kind('backend'))}"
        )
    return chosen


def _chosen_backend(manager: PluginRegistry, backend: str | None, backend_config: Any) -> sources.Setting:
    script_value, script_source = backend, f"Accelerator(backend={backend!r})" if backend else None
    if backend_config is not None:
        implied = backend_of_config(backend_config)
        if backend is not None and backend != implied:
            raise ConfigurationError(
                f"conflicting 'backend': Accelerator(backend={backend!r}) but the configuration object "
                f"{type(backend_config).__name__} belongs to backend {implied!r}"
            )
        script_value, script_source = implied, f"{type(backend_config).__name__} passed to the Accelerator"
    chosen = sources.resolve(
        "backend",
        script_value,
        script_source=script_source,
        default=None,
        environment=_accelerate_backend_switches(manager),
    )
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


def _accelerate_backend_switches(manager: PluginRegistry) -> list[sources.Setting]:
    """Accelerate's ``ACCELERATE_USE_FSDP=true`` (its launcher's ``--use_fsdp``; likewise DeepSpeed and
    Megatron-LM): the backend that declares that launch flag. A false value states no choice."""
    found = []
    for flag, distribution in ACCELERATE_BACKEND_FLAGS.items():
        variable = f"ACCELERATE_{flag.upper()}"
        raw = os.environ.get(variable, "").strip()
        if (
            not flag.startswith("use_")
            or not raw
            or not sources.to_bool(raw, f"environment variable {variable}")
        ):
            continue
        backend = manager.backend_for_flag(flag)
        if backend is None:
            raise PluginError(
                f"environment {variable}={raw} selects a backend plugin that is not installed: pip install "
                f"{distribution}"
            )
        found.append(sources.Setting(backend, f"environment {variable}={raw}"))
    return found


def precision_plugin(manager: PluginRegistry, mixed_precision: str) -> str | None:
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


def backend_settings(manager: PluginRegistry, backend: str) -> tuple[str | None, dict[str, Any]]:
    """(where they come from, the settings) of backend ``backend`` besides the script's object: what
    ``drivetrain launch`` handed over (its flags and config file), else the config file named by
    ``DRIVETRAIN_CONFIG_FILE`` (see :func:`file_backend_settings`). ``(None, {})`` when there are none."""
    launched = launched_backend_settings()
    if launched[0] is not None:
        return launched
    return file_backend_settings(manager, backend)


def launched_backend_settings() -> tuple[str | None, dict[str, Any]]:
    """The backend settings ``drivetrain launch`` handed to this process (``DRIVETRAIN_BACKEND_CONFIG``)."""
    launched = sources.launched_backend_config()
    return (f"environment {sources.BACKEND_CONFIG_ENV}", launched) if launched else (None, {})


def file_backend_settings(manager: PluginRegistry, backend: str) -> tuple[str | None, dict[str, Any]]:
    """Backend ``backend``'s section of the config file named by ``DRIVETRAIN_CONFIG_FILE``, when the file
    selects that backend: Accelerate's section for it (``PluginInfo.config_section``, with ``distributed_type``)
    or drivetrain's ``backend_config`` (with ``backend:``). ``(None, {})`` otherwise."""
    file = sources.config_file()
    if file is None or str(file.values.get("backend", "")).lower() != backend:
        return None, {}
    section = manager.info(backend).config_section if file.format == "accelerate" else None
    values = file.values.get("backend_config") or {}
    return f"config file {file.path}, section {section or 'backend_config'}", dict(values)


def plugin_options(manager: PluginRegistry, plugin: str) -> dict[str, Any]:
    """Plugin ``plugin``'s launch options and config-file keys: what ``drivetrain launch`` handed to this
    process, else the keys it claimed (``registry.add_config_keys``) in the config file named by
    ``DRIVETRAIN_CONFIG_FILE``, checked by the plugin. ``{}`` when there are none."""
    launched = sources.launched_plugin_options()
    if launched is not None:
        options = launched.get(plugin, {})
        return dict(options) if isinstance(options, dict) else {}
    file = sources.config_file()
    if file is None:
        return {}
    return dict(file.values.get("plugin_options", {}).get(plugin, {}))


def check_handlers_have_their_plugin(manager: PluginRegistry, handlers: list[Any], active: list[str]) -> None:
    """A precision plugin's kwargs handler (``FP8RecipeKwargs``) would be silently ignored in a run without
    that precision: say how to ask for it. (Backend handlers such as ``DistributedDataParallelKwargs`` are
    fine in any run: the same script runs on one process or many.)"""
    for handler in handlers:
        owner = manager.plugin_of(handler)
        if owner is None or owner in active or manager.info(owner).kind != "precision":
            continue
        precisions = manager.info(owner).precisions
        how = f"mixed_precision={precisions[0]!r}" if precisions else f"plugins=[{owner!r}]"
        raise ConfigurationError(
            f"{type(handler).__name__} configures plugin {owner!r}, which this Accelerator does not run, so "
            f"it would be ignored; pass Accelerator({how}) or remove the handler"
        )
