"""Whether this run asked for IPEX, and the launch flags and config-file keys that ask for it.

Device plugins are active whenever they are installed; this one changes training only when asked, in one of
the ways Accelerate users know plus the script's own:

- ``Accelerator(plugins=["ipex"])`` in the script;
- ``drivetrain launch --ipex`` (Accelerate's flag) or ``--use_xpu`` (Accelerate's XPU flag);
- the config file: ``ipex_config: {ipex: true}`` (what ``accelerate config`` writes), ``use_xpu: true``.

The launcher hands flags and config keys to the processes; ``plugin_api.plugin_options("ipex")`` reads them.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator
from drivetrain.plugin_api.settings import plugin_options, to_bool

PLUGIN_NAME = "ipex"
#: Accelerate's config-file section and the keys it may hold.
CONFIG_SECTION = "ipex_config"
SECTION_KEYS = ("ipex", "use_xpu")
#: How messages name Accelerate's XPU setting (a launch flag and a config key of the same name).
USE_XPU = "use_xpu (drivetrain launch --use_xpu or the config file)"


@dataclasses.dataclass(frozen=True)
class Request:
    """What the run asked of this plugin, and where that came from (for messages)."""

    #: optimise models and optimizers with ipex.optimize (an error when IPEX cannot be imported)
    optimize: bool = False
    #: train on an Intel XPU (Accelerate's ``use_xpu``): an error when none is visible; ipex.optimize runs
    #: there when IPEX is installed
    use_xpu: bool = False
    source: str = "nothing asked for ipex"


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """``drivetrain launch`` options (registered through ``registry.add_launch_options``)."""
    parser.add_argument(
        "--ipex",
        action="store_true",
        help="optimise models and optimizers with Intel Extension for PyTorch (ipex.optimize)",
    )
    parser.add_argument(
        "--use_xpu",
        action="store_true",
        help="train on the Intel XPU (an error when none is visible), with ipex.optimize when IPEX is installed",
    )


def check_flag(value: Any) -> bool:
    """A boolean config value (``use_xpu: true``); raises ValueError saying what is valid."""
    try:
        return to_bool(value)
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None


def check_section(value: Any) -> dict[str, bool]:
    """Accelerate's ``ipex_config`` section (``{ipex: true, use_xpu: false}``); raises ValueError naming the
    key that is wrong and what is valid."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping with the keys {', '.join(SECTION_KEYS)}")
    checked = {}
    for key, item in value.items():
        if key not in SECTION_KEYS:
            raise ValueError(f"unknown key {key!r} (valid keys: {', '.join(SECTION_KEYS)})")
        try:
            checked[key] = check_flag(item)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    return checked


def process_request() -> Request:
    """What ``drivetrain launch`` (its flags and the config file) asked of this plugin in this process."""
    options = plugin_options(PLUGIN_NAME)
    section = options.get(CONFIG_SECTION) or {}
    use_xpu = bool(options.get("use_xpu") or section.get("use_xpu"))
    if options.get("ipex"):
        return Request(optimize=True, use_xpu=use_xpu, source="drivetrain launch --ipex")
    if section.get("ipex"):
        return Request(optimize=True, use_xpu=use_xpu, source=f"config file {CONFIG_SECTION}: ipex: true")
    if use_xpu:
        return Request(use_xpu=True, source=USE_XPU)
    return Request()


def request(accelerator: PluginAccelerator) -> Request:
    """What this Accelerator's run asked of this plugin: the script's ``plugins=[...]`` first, then launch."""
    launched = process_request()
    if PLUGIN_NAME in accelerator.requested_plugins:
        return dataclasses.replace(launched, optimize=True, source=f"Accelerator(plugins=[{PLUGIN_NAME!r}])")
    return launched
