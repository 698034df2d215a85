"""Accelerate's ``accelerate.commands.config.default``: ``config default`` writes a basic config file for this
machine without questions."""

from __future__ import annotations

import argparse
from typing import Any

from drivetrain.commands.config_command import run as _run
from drivetrain.commands.parsing import add_option
from drivetrain.config.file import PRECISIONS, write_basic_config

description = "Write a basic config for this machine without questions."


def default_command_parser(parser: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``default`` to the subparsers ``parser``; ``args.func`` runs it."""
    sub = parser.add_parser("default", parents=parents, help=description, description=description)
    add_option(sub, "--config_file", metavar="PATH", help="where to write")
    add_option(sub, "--mixed_precision", choices=PRECISIONS, default="no", help="precision to record")
    add_option(sub, "--overwrite", action="store_true", help="replace an existing file")
    sub.set_defaults(func=default_config_command, config_command="default")
    return sub


def default_config_command(args: argparse.Namespace) -> int:
    args.config_command = "default"
    for name, default in (("config_file", None), ("mixed_precision", "no"), ("overwrite", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    return _run(args)


__all__ = ["default_command_parser", "default_config_command", "description", "write_basic_config"]
