"""``hooks_match_spec``: what can be checked without running the backend."""

from __future__ import annotations

from typing import Any

from drivetrain.plugin_api import PluginError, PluginInfo, PrecisionType
from drivetrain.plugin_api.tooling import HOOK_SPECS, hook_implementations
from drivetrain_conformance.targets import load_target


def check_spec(spec: str) -> tuple[str | None, PluginInfo | None]:
    """Return (why the backend breaks the contract or None, its PluginInfo when it loaded)."""
    try:
        _, module = load_target(spec)  # registration validates hook names, argument names, contract version
    except PluginError as exc:
        return f"the plugin was rejected: {exc}", None
    info = getattr(module, "PLUGIN_INFO", None)
    if info is None:
        return (
            "the module declares no PLUGIN_INFO; add PLUGIN_INFO = PluginInfo(kind='backend', "
            "capabilities=Capabilities(...))"
        ), PluginInfo(kind="backend")
    problems = []
    if info.kind != "backend":
        problems.append(
            f"PLUGIN_INFO.kind is {info.kind!r}; the suite checks distribution backends (kind='backend')"
        )
    unknown = [p for p in info.capabilities.precisions if p not in PrecisionType.list()]
    if unknown:
        problems.append(
            f"capabilities.precisions names unknown modes {unknown} (valid: {PrecisionType.list()})"
        )
    if not info.capabilities.devices:
        problems.append("capabilities.devices is empty")
    if info.capabilities.joinable and not info.capabilities.multi_process:
        problems.append(
            "capabilities.joinable=True with multi_process=False: Join only matters across processes; "
            "declare multi_process=True or joinable=False"
        )
    marked = hook_implementations(module)
    for hook in HOOK_SPECS:
        function: Any = getattr(module, hook, None)
        if callable(function) and hook not in marked:
            problems.append(
                f"function {hook!r} is named like a hook but lacks @hookimpl, so drivetrain never calls it"
            )
    return ("; ".join(problems) or None), info
