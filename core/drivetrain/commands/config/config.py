"""Accelerate's ``accelerate.commands.config.config``: the ``config`` command's parser and entry points, over
``drivetrain config`` (:mod:`drivetrain.commands.config_command`)."""

from __future__ import annotations

import argparse
from typing import Any

from drivetrain.commands.config_command import HELP, Questions, questionnaire, register_parser
from drivetrain.commands.config_command import run as _run
from drivetrain.commands.parsing import ArgumentParser, exit_code_of

description = HELP


def config_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``config`` parser (added to ``subparsers`` when given), with its ``default`` and ``update``
    subcommands; ``args.func`` runs the command."""
    if subparsers is not None:
        parser = subparsers.add_parser("config", description=description, help=description)
    else:
        parser = ArgumentParser(prog="drivetrain config", description=description)
    register_parser(parser)
    parser.set_defaults(func=config_command)
    return parser


#: Accelerate builds the subcommands in ``get_config_parser``; here they come with the parser.
get_config_parser = config_command_parser


def get_user_input() -> dict[str, Any]:
    """Ask the config questions on the terminal (or read the answers piped in); returns the file's keys."""
    return questionnaire(Questions())


def config_command(args: argparse.Namespace) -> int:
    return _run(args)


def main() -> int:
    parser = config_command_parser()
    args = parser.parse_args()
    return exit_code_of(lambda: config_command(args))


__all__ = [
    "config_command",
    "config_command_parser",
    "description",
    "get_config_parser",
    "get_user_input",
    "main",
]
