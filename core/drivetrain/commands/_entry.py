"""Accelerate's command entry points (``<name>_command_parser(subparsers=None)``, ``<name>_command(args)``)
built from a drivetrain command module's ``register_parser`` / ``run`` / ``HELP``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from drivetrain.commands.parsing import ArgumentParser, exit_code_of


def command_parser(
    name: str, register: Callable, run: Callable, help_text: str
) -> Callable[..., argparse.ArgumentParser]:
    def parser_for(subparsers: Any = None) -> argparse.ArgumentParser:
        if subparsers is not None:
            parser = subparsers.add_parser(name, help=help_text, description=help_text)
        else:
            parser = ArgumentParser(prog=f"drivetrain {name}", description=help_text)
        register(parser)
        parser.set_defaults(func=run)
        return parser

    parser_for.__doc__ = f"The ``{name}`` parser (added to ``subparsers`` when given); ``args.func`` runs it."
    return parser_for


def command_main(parser_for: Callable[..., argparse.ArgumentParser], run: Callable) -> Callable[[], int]:
    def main() -> int:
        args = parser_for().parse_args()
        return exit_code_of(lambda: run(args))

    return main
