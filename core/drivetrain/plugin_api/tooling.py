"""For tools that check or list plugins rather than for plugins: the conformance suite, listings,
benchmarks. They read the hook specs, load plugins through the kernel's manager and build Accelerators."""

from __future__ import annotations

from drivetrain.accelerator import Accelerator
from drivetrain.contract.manager import (
    HOOK_SPECS,
    check_requirements,
    get_plugin_manager,
    hook_implementations,
)

__all__ = ["Accelerator", "HOOK_SPECS", "get_plugin_manager", "check_requirements", "hook_implementations"]
