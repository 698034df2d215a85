"""Contract 1.1's flat names of ``drivetrain.plugin_api``, kept importable for plugins written for 1.1.

Contract 1.2 keeps the names nearly every plugin needs at the top of ``drivetrain.plugin_api`` and groups
the other helpers in namespaces, under the same names. A 1.1 plugin's ``from drivetrain.plugin_api import
safe_load`` still works and warns once per name, naming the new place; contract 2.0 drops the flat names.
"""

from __future__ import annotations

import ast
import functools
import importlib
import warnings
from pathlib import Path
from typing import Any

#: The namespaces, in the order of the reference page (docs/plugins/api.md).
NAMESPACES = ("settings", "state", "training", "data", "checkpoint", "big_model", "tracking", "tooling")

#: Names of the namespaces that contract 1.2 added: they were never flat names.
ADDED_IN_1_2 = frozenset(
    {
        "reference_backward",
        "resolve_backend_config",
        "BackendConfigReader",
        "checkpoint_path",
        "read_scheduler_state",
    }
)

#: 1.1 flat names that contract 1.2 leaves out (no plugin used them) -> (kernel module, name there, what to
#: use instead). They still import as 1.1 names, with the advice in the warning; contract 2.0 drops them.
REMOVED: dict[str, tuple[str, str, str]] = {
    "GradientState": (
        "drivetrain.state",
        "GradientState",
        "read accelerator.gradient_state or accelerator.sync_gradients in a hook",
    ),
    "HOOK_STYLES": (
        "drivetrain.contract.hookspecs",
        "HOOK_STYLES",
        "docs/hooks.md says how each hook is called",
    ),
    "resolve_setting": (
        "drivetrain.config.sources",
        "resolve",
        "read a plugin's settings with plugin_api.settings.plugin_options or backend_settings",
    ),
    "to_int": (
        "drivetrain.config.sources",
        "to_int",
        "use int() and raise ConfigurationError naming the setting",
    ),
}


@functools.cache
def moved() -> dict[str, str]:
    """1.1 flat name -> the namespace that holds it in 1.2, read from each namespace's ``__all__`` in its
    source: finding the place of one old name must not import every namespace (their services)."""
    table: dict[str, str] = {}
    for namespace in NAMESPACES:
        source = (Path(__file__).parent / f"{namespace}.py").read_text(encoding="utf-8")
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                names = ast.literal_eval(node.value)
                table.update((name, namespace) for name in names if name not in ADDED_IN_1_2)
    return table


def moved_name(name: str, namespace: dict[str, Any]) -> Any:
    """``drivetrain.plugin_api.<name>`` for a name not in ``namespace`` (its globals): a namespace (imported
    now), or a 1.1 flat name (with a DeprecationWarning naming its 1.2 place, then kept in ``namespace``),
    else an AttributeError saying where the names are."""
    if name in NAMESPACES:
        return importlib.import_module(f"drivetrain.plugin_api.{name}")
    if name in REMOVED:
        module, attribute, advice = REMOVED[name]
        message = (
            f"drivetrain.plugin_api.{name} is a contract 1.1 name that contract 1.2 leaves out: {advice}"
        )
    elif name in moved():
        module, attribute = f"drivetrain.plugin_api.{moved()[name]}", name
        message = (
            f"drivetrain.plugin_api.{name} is a contract 1.1 name: import it from {module} (contract 1.2)"
        )
    else:
        raise AttributeError(
            f"drivetrain.plugin_api has no {name!r}: plugins import only what it declares "
            "(see docs/plugins/api.md); ask for what you need in an issue"
        )
    warnings.warn(
        f"{message}; the flat name goes in contract 2.0 (docs/plugins/versioning.md)",
        DeprecationWarning,
        stacklevel=3,
    )
    value = getattr(importlib.import_module(module), attribute)
    namespace[name] = value  # warned once: later reads find it
    return value
