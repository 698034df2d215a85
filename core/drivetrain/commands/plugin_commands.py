"""Accelerate's commands that a plugin provides (``to-fsdp2``, ``tpu-config``: see
:data:`drivetrain.compat.cli_options.ACCELERATE_PLUGIN_COMMANDS`). An installed plugin registers the real command
(``registry.add_command``); without it, the command accepts Accelerate's options and fails in one line naming
the distribution to install."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from drivetrain.commands.parsing import add_option
from drivetrain.compat import cli_options
from drivetrain.errors import UsageError


def stand_in(
    command: str,
) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]:
    """``(register_parser, run, help)`` of the stand-in for ``command``."""
    distribution, help_text, options = cli_options.ACCELERATE_PLUGIN_COMMANDS[command]

    def register_parser(parser: argparse.ArgumentParser) -> None:
        for flag, takes_value, repeatable in options:
            if not takes_value:
                add_option(parser, flag, action="store_true")
            else:
                add_option(parser, flag, action="append" if repeatable else "store")

    def run(args: argparse.Namespace) -> int:
        raise UsageError(
            f"`drivetrain {command}` is provided by a plugin that is not installed: pip install {distribution}"
        )

    return register_parser, run, f"{help_text} [needs {distribution}]"
