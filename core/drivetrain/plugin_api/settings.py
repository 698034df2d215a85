"""Settings a plugin reads: what ``drivetrain launch`` and the config file hand it, the parser the kernel
uses for its own switches (so that a plugin's options accept the same spellings), and the base class of the
keyword-argument handlers a script passes in ``Accelerator(kwargs_handlers=[...])``."""

from __future__ import annotations

import os
from typing import Any

from drivetrain.config.backend_config import BackendConfigReader
from drivetrain.config.backend_config import resolve as _resolve_backend_config
from drivetrain.config.kwargs_handlers import KwargsHandler
from drivetrain.config.sources import BACKEND_CONFIG_ENV, CONFIG_FILE_ENV, to_bool
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.contract.selection import backend_settings as _backend_settings
from drivetrain.contract.selection import file_backend_settings as _file_backend_settings
from drivetrain.contract.selection import launched_backend_settings as _launched_backend_settings
from drivetrain.contract.selection import plugin_options as _plugin_options

__all__ = [
    "BackendConfigReader",
    "KwargsHandler",
    "backend_settings",
    "plugin_options",
    "resolve_backend_config",
    "to_bool",
]


def backend_settings(backend: str) -> tuple[str | None, dict[str, Any]]:
    """(where they come from, the settings) of backend ``backend`` when the script passed no configuration
    object: what ``drivetrain launch`` handed over (the backend's flags and config-file section), else the
    config file named by ``DRIVETRAIN_CONFIG_FILE`` (Accelerate's ``PluginInfo.config_section`` section, or
    ``backend_config`` when ``backend:`` names the backend). ``(None, {})`` when there are none."""
    return _backend_settings(get_plugin_registry(), backend)


def plugin_options(plugin: str) -> dict[str, Any]:
    """Plugin ``plugin``'s launch options and config-file keys, by name: what ``drivetrain launch`` handed to
    this process, else the keys the plugin claimed (``registry.add_config_keys``) in the config file named by
    ``DRIVETRAIN_CONFIG_FILE``, checked by the plugin. ``{}`` when there are none."""
    return _plugin_options(get_plugin_registry(), plugin)


def resolve_backend_config(reader: BackendConfigReader, given: Any) -> Any:
    """The configuration backend ``reader.backend`` runs with: the script's object ``given`` (or None) with the
    fields it leaves unset filled from what ``drivetrain launch`` handed over (``DRIVETRAIN_BACKEND_CONFIG``),
    the backend's own variables (``reader.variables``) and the config file named by ``DRIVETRAIN_CONFIG_FILE``;
    a field two sources set differently is a ConfigurationError naming both values.

    Resolved once per object, run and launcher settings: the result is kept in the process state, so the
    Accelerator, its checkpoints and ``AcceleratorState().<backend>_plugin`` share one object, and
    ``drivetrain.reset_state()`` forgets it. A process that changes ``DRIVETRAIN_BACKEND_CONFIG`` or
    ``DRIVETRAIN_CONFIG_FILE`` between two Accelerators (the conformance suite does) gets a new resolution.
    See docs/configuration.md and :class:`BackendConfigReader`."""
    from drivetrain.state import PartialState

    # The raw text of the two variables: two lookups, cheap enough for backends that ask every step.
    handed_over = (os.environ.get(BACKEND_CONFIG_ENV), os.environ.get(CONFIG_FILE_ENV))
    resolved = PartialState.resolved_backend_configs
    for backend, earlier, environment, config in resolved:
        if backend == reader.backend and earlier is given and environment == handed_over:
            return config
    manager = get_plugin_registry()
    config = _resolve_backend_config(
        reader,
        given,
        launched=_launched_backend_settings(),
        config_file=_file_backend_settings(manager, reader.backend),
    )
    resolved.append((reader.backend, given, handed_over, config))
    return config
