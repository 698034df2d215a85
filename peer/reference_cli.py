"""Run with the reference's interpreter: writes every option of the reference's commands (launch, config,
env, estimate-memory, merge-weights, to-fsdp2, tpu-config, test) as JSON to the path given, for
peer/reference_cli.json (``python -m peer.names --cli-snapshot PYTHON``). Reads the reference's parsers only."""

from __future__ import annotations

import argparse
import json
import sys


def options(parser: argparse.ArgumentParser) -> list[list[str]]:
    """Each option's spellings (a positional's destination), subcommands left out."""
    found = []
    for action in parser._actions:
        if action.option_strings:
            found.append(sorted(action.option_strings))
        elif not isinstance(action, argparse._SubParsersAction):
            found.append([action.dest])
    return found


def main(path: str) -> None:
    from accelerate.commands import env, estimate, launch, merge, test, to_fsdp2, tpu
    from accelerate.commands.config import get_config_parser

    config = get_config_parser()
    (subcommands,) = [action for action in config._actions if isinstance(action, argparse._SubParsersAction)]
    snapshot = {
        "launch": options(launch.launch_command_parser()),
        "env": options(env.env_command_parser()),
        "estimate-memory": options(estimate.estimate_command_parser()),
        "merge-weights": options(merge.merge_command_parser()),
        "to-fsdp2": options(to_fsdp2.to_fsdp2_command_parser()),
        "tpu-config": options(tpu.tpu_command_parser()),
        "test": options(test.test_command_parser()),
        "config": options(config),
        "config default": options(subcommands.choices["default"]),
        "config update": options(subcommands.choices["update"]),
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(snapshot, handle, indent=1)
        handle.write("\n")
    print({command: len(found) for command, found in snapshot.items()})


if __name__ == "__main__":
    main(sys.argv[1])
