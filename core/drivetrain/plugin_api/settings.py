"""Settings a plugin reads: what ``drivetrain launch`` and the config file hand it, the parser the kernel
uses for its own switches (so that a plugin's options accept the same spellings), and the base class of the
keyword-argument handlers a script passes in ``Accelerator(kwargs_handlers=[...])``."""

from __future__ import annotations

from typing import Any

from drivetrain.config.kwargs_handlers import KwargsHandler
from drivetrain.config.sources import to_bool
from drivetrain.contract.manager import get_plugin_manager
from drivetrain.contract.selection import backend_settings as _backend_settings
from drivetrain.contract.selection import plugin_options as _plugin_options

__all__ = ["backend_settings", "plugin_options", "to_bool", "KwargsHandler"]


def backend_settings(backend: str) -> tuple[str | None, dict[str, Any]]:
    """(where they come from, the settings) of backend ``backend`` when the script passed no configuration
    object: what ``drivetrain launch`` handed over (the backend's flags and config-file section), else the
    config file named by ``DRIVETRAIN_CONFIG_FILE`` (Accelerate's ``PluginInfo.config_section`` section, or
    ``backend_config`` when ``backend:`` names the backend). ``(None, {})`` when there are none."""
    return _backend_settings(get_plugin_manager(), backend)


def plugin_options(plugin: str) -> dict[str, Any]:
    """Plugin ``plugin``'s launch options and config-file keys, by name: what ``drivetrain launch`` handed to
    this process, else the keys the plugin claimed (``registry.add_config_keys``) in the config file named by
    ``DRIVETRAIN_CONFIG_FILE``, checked by the plugin. ``{}`` when there are none."""
    return _plugin_options(get_plugin_manager(), plugin)
