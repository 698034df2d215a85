"""Accelerate's ``accelerate.commands.config.update``: ``config update`` rewrites an existing (or Accelerate)
config file in drivetrain's format."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from drivetrain.commands.config_command import run as _run
from drivetrain.commands.parsing import add_option

description = "Rewrite an existing config file (also Accelerate's) in drivetrain's format."


def update_command_parser(parser: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    sub = parser.add_parser("update", parents=parents, help=description, description=description)
    add_option(sub, "--config_file", metavar="PATH", help="the file to update")
    sub.set_defaults(func=update_config_command, config_command="update")
    return sub


def update_config(args: argparse.Namespace) -> Path:
    """Rewrite the file; returns its path."""
    from drivetrain.config.file import load_config, save_config
    from drivetrain.contract.registry import get_plugin_registry

    declarations = get_plugin_registry().config_declarations()
    config = load_config(getattr(args, "config_file", None), required=True, plugins=declarations)
    return save_config(config.values, config.path, declarations)


def update_config_command(args: argparse.Namespace) -> int:
    args.config_command = "update"
    if not hasattr(args, "config_file"):
        args.config_file = None
    return _run(args)


__all__ = ["description", "update_command_parser", "update_config", "update_config_command"]
