"""Naming the backend under test: an installed plugin name, or a ``.py`` file defining a plugin module
(handy before the package is installed: ``drivetrain conformance ./my_backend.py``)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from drivetrain.plugin_api import PluginError
from drivetrain.plugin_api.tooling import get_plugin_registry


def is_file_target(spec: str) -> bool:
    return spec.endswith(".py")


def target_name(spec: str) -> str:
    """The plugin name a target runs under (a file's stem with ``_`` read as ``-``)."""
    if is_file_target(spec):
        return os.path.splitext(os.path.basename(spec))[0].replace("_", "-")
    return spec


def load_target(spec: str) -> tuple[str, Any]:
    """Load (and for a file, register) the plugin; returns its name and module. Raises PluginError."""
    manager = get_plugin_registry()
    name = target_name(spec)
    if not is_file_target(spec):
        return name, manager.load(name).module  # an unknown name raises, listing the installed ones
    existing = manager.discovered().get(name)
    if existing is not None and existing.loaded:
        return name, existing.module
    path = os.path.abspath(spec)
    if not os.path.isfile(path):
        raise PluginError(f"backend file {spec!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(
        f"drivetrain_conformance_target_{name.replace('-', '_')}", path
    )
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"cannot import backend file {spec!r}")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise PluginError(f"backend file {spec!r} failed to import: {type(exc).__name__}: {exc}") from exc
    manager.register(name, module, distribution=f"file {path}")
    return name, module
