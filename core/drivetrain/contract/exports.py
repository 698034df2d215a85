"""Names that plugins provide to the kernel's public namespaces: exported objects (``DeepSpeedPlugin`` from
``drivetrain``) and attributes of the shared state (``AcceleratorState().deepspeed_plugin``)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as importlib_metadata
from typing import Any

from drivetrain.compat.distributions import UNPUBLISHED_DISTRIBUTIONS
from drivetrain.compat.install_hints import PLUGIN_EXPORTS
from drivetrain.contract.info import EXPORTS_GROUP
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.errors import PluginError


def registered_attribute(name: str, state: Any, owner: str, on_accelerator: bool = False) -> Any:
    """The value of the attribute ``name`` a plugin registered with ``registry.add_state_attribute`` (for
    ``AcceleratorState.__getattr__`` and ``Accelerator.__getattr__``, i.e. names nothing else has).

    Plugins not loaded yet are loaded (their modules only) when the name is not registered: a script may ask
    ``accelerator.state.<backend>_plugin`` in a run of another backend. Raises AttributeError otherwise."""
    missing = AttributeError(f"{owner!r} object has no attribute {name!r}")
    if name.startswith("_"):  # private and dunder lookups (copy, pickle, hasattr probes) never load plugins
        raise missing
    manager = get_plugin_registry()
    entry = manager.extensions.state_attributes.get(name)
    if entry is None:
        for plugin in manager.names():
            with contextlib.suppress(PluginError):  # a broken plugin is reported where it is used
                manager.load(plugin)
        entry = manager.extensions.state_attributes.get(name)
    if entry is None or (on_accelerator and not entry[2]):
        raise missing
    return entry[1](state)


def resolve_export(name: str) -> Any:
    """Resolve a plugin-provided public name through the ``drivetrain.exports`` entry-point group. Raises
    ImportError naming the distribution to install, AttributeError for a name no plugin provides."""
    for entry_point in importlib_metadata.entry_points(group=EXPORTS_GROUP):
        if entry_point.name == name:
            return entry_point.load()
    distribution = PLUGIN_EXPORTS.get(name)
    if distribution is None:
        raise AttributeError(name)
    raise ImportError(f"{name} is provided by a plugin: pip install {distribution}")


def lazy_getattr(module_name: str, table: dict[str, str], name: str) -> Any:
    """Resolve ``name`` for a module's ``__getattr__`` from ``table`` (``name -> "module:attribute"``), else
    from a plugin's exports, so that ``import drivetrain`` costs little more than ``import torch``."""
    target = table.get(name)
    if target is not None:
        module_path, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module_path), attribute or name)
    if name.startswith("__"):
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    try:
        return resolve_export(name)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}") from None
    except ImportError:  # importable without its plugin; using it says what to install
        from drivetrain.compat.placeholders import missing_plugin_name

        distribution = PLUGIN_EXPORTS[name]
        return missing_plugin_name(
            name, distribution, module_name, UNPUBLISHED_DISTRIBUTIONS.get(distribution)
        )
