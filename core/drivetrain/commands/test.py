"""``drivetrain test``: run the packaged self-check with the user's config and print a verdict."""

from __future__ import annotations

import argparse
import sys

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
