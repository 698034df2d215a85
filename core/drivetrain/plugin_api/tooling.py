"""For tools that check or list plugins rather than for plugins: the conformance suite, listings,
benchmarks. They read the hook specs, load plugins through the kernel's registry and build Accelerators."""

from __future__ import annotations

from drivetrain.accelerator import Accelerator
from drivetrain.contract.registry import (
    HOOK_SPECS,
    check_requirements,
    get_plugin_manager,
    get_plugin_registry,
    hook_implementations,
)

__all__ = [
    "Accelerator",
    "HOOK_SPECS",
    "get_plugin_registry",
    "get_plugin_manager",  # contract 1.2's name of get_plugin_registry
    "check_requirements",
    "hook_implementations",
]
