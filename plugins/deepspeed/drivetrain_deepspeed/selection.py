"""Which DeepSpeed configuration is in charge: one plugin, a ``deepspeed_plugins`` dict, or the launcher's.

``Accelerator(deepspeed_plugins={"student": ..., "teacher": ...})`` arrives as
``accelerator.state.backend_config``, a dict (with ``.backend_name``) of plugins. The first one is active
until :func:`select_deepspeed_plugin` picks another; the next model prepared uses the active one.
Without any plugin the launcher's settings (``DRIVETRAIN_BACKEND_CONFIG``, from ``--zero_stage`` etc. or the
config file's ``deepspeed_config`` section) build one, else DeepSpeed's defaults.
"""

from __future__ import annotations

import json
from typing import Any

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.settings import backend_settings
from drivetrain_deepspeed import transformers_link
from drivetrain_deepspeed.config import DeepSpeedPlugin

#: Plugin built from the launcher's settings or the config file, by their JSON text (one per process: they
#: do not change during a run).
_from_environment: dict[str, DeepSpeedPlugin] = {}


def plugin_from_environment() -> DeepSpeedPlugin | None:
    origin, values = backend_settings("deepspeed")
    if origin is None:
        return None
    key = json.dumps(values, sort_keys=True, default=str)
    if key not in _from_environment:
        _from_environment.clear()
        _from_environment[key] = DeepSpeedPlugin.from_mapping(values, origin)
    return _from_environment[key]


def _state_of(state_or_accelerator: Any) -> Any:
    return getattr(state_or_accelerator, "state", state_or_accelerator)


def _backend_config(state_or_accelerator: Any) -> Any:
    state = _state_of(state_or_accelerator)
    if getattr(state, "backend_name", "deepspeed") != "deepspeed":
        raise ConfigurationError(
            f"this run uses backend {state.backend_name!r}, not 'deepspeed'; DeepSpeed plugins apply only with "
            "Accelerator(deepspeed_plugin=...) or --backend deepspeed"
        )
    return getattr(state, "backend_config", None)


def get_active_deepspeed_plugin(state: Any) -> DeepSpeedPlugin:
    """The plugin the next ``prepare`` uses (``state``: an AcceleratorState or an Accelerator)."""
    config = _backend_config(state)
    if isinstance(config, DeepSpeedPlugin):
        return config
    if isinstance(config, dict):
        _check_group(config)
        for plugin in config.values():
            if plugin.selected:
                return plugin
        first = next(iter(config.values()))
        first.select(_from_accelerator_state=True)
        return first
    from_environment = plugin_from_environment()
    if from_environment is not None:
        return from_environment
    if "default" not in _from_environment:
        _from_environment["default"] = DeepSpeedPlugin()
    return _from_environment["default"]


def select_deepspeed_plugin(state: Any, name: str) -> DeepSpeedPlugin:
    """Make ``deepspeed_plugins[name]`` the active plugin (Accelerate's ``state.select_deepspeed_plugin``)."""
    config = _backend_config(state)
    if not isinstance(config, dict):
        raise ConfigurationError(
            "select_deepspeed_plugin needs several plugins: Accelerator(deepspeed_plugins={'name': DeepSpeedPlugin(...)})"
        )
    _check_group(config)
    if name not in config:
        raise ConfigurationError(
            f"no DeepSpeed plugin named {name!r}; deepspeed_plugins holds: {', '.join(map(repr, config))}"
        )
    for key, plugin in config.items():
        if key != name:
            plugin._unselect()
    config[name].select(_from_accelerator_state=True)
    return config[name]


transformers_link.active_plugin_of = get_active_deepspeed_plugin


def _check_group(config: dict[str, Any]) -> None:
    wrong = [key for key, value in config.items() if not isinstance(value, DeepSpeedPlugin)]
    if wrong or not config:
        raise ConfigurationError(
            "deepspeed_plugins must map names to DeepSpeedPlugin objects"
            + (f"; not a DeepSpeedPlugin: {', '.join(map(repr, wrong))}" if wrong else " (it is empty)")
        )


# -- Accelerate's spellings on AcceleratorState / Accelerator (registered in plugin.register_extensions) ----
def _runs_deepspeed(state: Any) -> bool:
    return getattr(_state_of(state), "backend_name", None) == "deepspeed"


def state_deepspeed_plugin(state: Any) -> DeepSpeedPlugin | None:
    """``state.deepspeed_plugin`` / ``accelerator.deepspeed_plugin``: the active plugin; None in a run of
    another backend (as Accelerate)."""
    return get_active_deepspeed_plugin(state) if _runs_deepspeed(state) else None


def state_deepspeed_plugins(state: Any) -> Any:
    """``state.deepspeed_plugins``: the dict passed as ``deepspeed_plugins=``, else the one plugin in use (as
    Accelerate, which stores whichever it was given); None in a run of another backend."""
    if not _runs_deepspeed(state):
        return None
    config = _backend_config(state)
    return config if isinstance(config, dict) else get_active_deepspeed_plugin(state)


def state_select_deepspeed_plugin(state: Any) -> Any:
    """``state.select_deepspeed_plugin(name)``."""
    return lambda name: select_deepspeed_plugin(state, name)


def state_get_deepspeed_plugin(state: Any) -> Any:
    """``state.get_deepspeed_plugin(name)``: ``deepspeed_plugins[name]`` without selecting it."""

    def get(name: str) -> DeepSpeedPlugin:
        config = _backend_config(state)
        if not isinstance(config, dict) or name not in config:
            held = ", ".join(map(repr, config)) if isinstance(config, dict) else "no named plugins"
            raise ConfigurationError(f"no DeepSpeed plugin named {name!r}; deepspeed_plugins holds: {held}")
        return config[name]

    return get
