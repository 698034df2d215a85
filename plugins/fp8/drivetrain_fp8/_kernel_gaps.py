"""Stop-gap: every kernel name this plugin uses, until ``drivetrain.plugin_api`` (contract 1.1) lands.

Each line names what 1.1 provides instead; after the merge this file imports only from ``plugin_api``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import attrs

from drivetrain.errors import ConfigurationError, PluginError  # 1.1: plugin_api
from drivetrain.hookspecs import hookimpl  # 1.1: plugin_api
from drivetrain.kwargs_handlers import KwargsHandler  # 1.1: plugin_api
from drivetrain.modeling import patch_forward_with_autocast  # 1.1: plugin_api
from drivetrain.optimizer import AcceleratedOptimizer  # not in 1.1: see plugin README, "kernel gaps"
from drivetrain.plugins import Capabilities, PluginInfo  # 1.1: plugin_api

__all__ = [
    "AcceleratedOptimizer",
    "Capabilities",
    "ConfigurationError",
    "KwargsHandler",
    "PluginError",
    "PluginInfo",
    "hookimpl",
    "patch_forward_with_autocast",
    "pending_optimizers",
    "plugin_info",
    "plugin_options",
    "prepared_optimizers",
]


def plugin_options(plugin_name: str) -> dict[str, Any]:
    """1.1: ``plugin_api.plugin_options``. Until then: the launcher's DRIVETRAIN_PLUGIN_OPTIONS (flags only;
    config-file keys need ``registry.add_config_keys``)."""
    text = os.environ.get("DRIVETRAIN_PLUGIN_OPTIONS")
    return dict(json.loads(text).get(plugin_name, {})) if text else {}


def pending_optimizers(accelerator: Any) -> list[Any]:
    """1.1: ``accelerator.prepared.pending_optimizers``."""
    return list(accelerator.pending_optimizers)


def prepared_optimizers(accelerator: Any) -> list[Any]:
    """1.1: ``accelerator.prepared.optimizers``."""
    return list(accelerator._optimizers)


def plugin_info(**fields: Any) -> PluginInfo:
    """1.1: ``PluginInfo(...)`` with ``optional_requires``; until then that field is left out."""
    if "optional_requires" not in attrs.fields_dict(PluginInfo):
        fields.pop("optional_requires", None)
    return PluginInfo(**fields)
