"""``drivetrain merge-weights`` (Accelerate's ``accelerate.commands.merge``): merge a sharded checkpoint (one
shard per process, as the sharding backend saves it) into one weights file. The merge itself is the sharding
backend plugin's; without it the command says what to install."""

from __future__ import annotations

import argparse
from typing import Any

from drivetrain.commands.parsing import ArgumentParser, add_option, exit_code_of

HELP = "Merge a sharded checkpoint (one shard per process) into one weights file (.safetensors by default)."
description = HELP


def register_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_directory", help="folder holding the shards")
    parser.add_argument("output_path", help="folder to write the merged weights into")
    add_option(
        parser,
        "--unsafe_serialization",
        action="store_true",
        help="write .bin (pickle) instead of .safetensors",
    )
    add_option(parser, "--remove_checkpoint_dir", action="store_true", help="delete the shards after merging")


def merge_command(args: argparse.Namespace) -> None:
    import importlib

    from drivetrain.compat import cli_options

    merge = getattr(importlib.import_module("drivetrain.utils"), cli_options.ACCELERATE_MERGE_FUNCTION)
    merge(
        args.checkpoint_directory, args.output_path, not args.unsafe_serialization, args.remove_checkpoint_dir
    )


def run(args: argparse.Namespace) -> int:
    from drivetrain.errors import UsageError

    try:
        merge_command(args)
    except ImportError as error:  # the plugin is not installed: one line saying which
        raise UsageError(str(error)) from None
    return 0


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    if subparsers is not None:
        parser = subparsers.add_parser("merge-weights", help=HELP, description=HELP)
    else:
        parser = ArgumentParser(prog="drivetrain merge-weights", description=HELP)
    register_parser(parser)
    parser.set_defaults(func=merge_command)
    return parser


def main() -> int:
    args = merge_command_parser().parse_args()
    return exit_code_of(lambda: run(args))


__all__ = ["HELP", "description", "main", "merge_command", "merge_command_parser", "register_parser", "run"]
