"""``drivetrain test``: run the packaged self-check with the user's config and print a verdict."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from drivetrain.commands.parsing import add_option

HELP = "Check that drivetrain works here: run a self-check script with your config, print a verdict."


def register_parser(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--config_file", metavar="PATH", help="config file to test (default: the user's)")


def run(args: argparse.Namespace) -> int:
    from drivetrain.commands import launch

    argv = ["--config_file", args.config_file] if args.config_file else []
    # As a module: a script path inside the package would put the package folder first on sys.path, where
    # drivetrain/logging.py would shadow the standard library's logging.
    code = launch.main([*argv, "--module", "drivetrain.commands.self_check"])
    if code == 0:
        print("Test is a success! drivetrain is ready for your distributed training.")
    else:
        print(f"Test failed (exit code {code}); the error is printed above.", file=sys.stderr)
    return code


# Accelerate's ``accelerate.commands.test`` entry points.
def test_command(args: argparse.Namespace) -> int:
    return run(args)


def __getattr__(attribute: str) -> Any:
    from drivetrain.commands._entry import command_main, command_parser

    parser_for = command_parser("test", register_parser, test_command, HELP)
    if attribute == "test_command_parser":
        return parser_for
    if attribute == "main":
        return command_main(parser_for, test_command)
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
