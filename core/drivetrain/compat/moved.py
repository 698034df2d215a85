"""Module paths of drivetrain 0.1 (plugin contract 1.0) that moved when the kernel was laid out in packages.

Importing one still works, with a DeprecationWarning naming the new place: a plugin written for contract 1.0
keeps loading, and says what to change. Accelerate's own paths are not listed here: they are modules, or
generated from their tables in :mod:`drivetrain.compat.paths`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

#: old path -> where its names live now
MOVED = {
    "drivetrain.plugins": "drivetrain.plugin_api",
    "drivetrain.hookspecs": "drivetrain.plugin_api",
    "drivetrain.collectives": "drivetrain.plugin_api",
    "drivetrain.settings": "drivetrain.config.sources",
    "drivetrain.enums": "drivetrain.config.enums",
    "drivetrain.configuration": "drivetrain.config.dataclasses",
    "drivetrain.kwargs_handlers": "drivetrain.config.kwargs_handlers",
    "drivetrain.config_file": "drivetrain.config.file",
    "drivetrain.random": "drivetrain.operations.random",
    "drivetrain.memory": "drivetrain.operations.memory",
    "drivetrain.modeling": "drivetrain.training.modeling",
    "drivetrain.profiling": "drivetrain.training.profiling",
    "drivetrain.environment": "drivetrain.config.environment_variables",
    "drivetrain.contract.manager": "drivetrain.contract.registry",
}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new_name} (a moved drivetrain path; plugins import from "
            "drivetrain.plugin_api, see docs/plugins/versioning.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new_name)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths in :data:`MOVED` (and nothing else)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(new_name))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import drivetrain`` does)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
