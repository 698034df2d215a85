"""The command-line tables of drivetrain.compat.cli_options are derived from short specs; what they derive is
checked here against the reference's own parsers (peer/reference_cli.json, from accelerate==1.15.0)."""

from __future__ import annotations

import json

from drivetrain.compat import cli_options
from peer import names as reference


def _reference_options() -> dict[str, list[tuple[str, ...]]]:
    snapshot = json.loads(reference.CLI_SNAPSHOT.read_text())
    return {command: [tuple(option) for option in options] for command, options in snapshot.items()}


def test_each_plugin_launch_option_is_spelled_as_the_reference_spells_it():
    launch = _reference_options()["launch"]
    for spellings, dest, _, _ in cli_options.ACCELERATE_LAUNCH_PLUGIN_OPTIONS:
        assert spellings in launch, spellings  # both spellings, in the reference's order, or the one (--vm)
        if dest != "tpu_use_cluster":
            assert spellings[-1] == "--" + dest


def test_the_plugin_launch_options_are_the_39_there_were():
    options = cli_options.ACCELERATE_LAUNCH_PLUGIN_OPTIONS
    assert len(options) == len({spellings for spellings, *_ in options}) == 39
    by_distribution: dict[str, int] = {}
    for _, _, _, distribution in options:
        by_distribution[distribution] = by_distribution.get(distribution, 0) + 1
    assert by_distribution == {
        "drivetrain-xla": 6,
        "drivetrain-megatron": 27,
        "drivetrain-sagemaker": 2,
        "drivetrain-ipex": 1,
        "drivetrain-deepspeed": 3,
    }
    flags = {spellings[0] for spellings, _, takes_value, _ in options if not takes_value}
    assert flags == {"--tpu-cluster", "--no-tpu-cluster", "--tpu-use-sudo", "--downcast-bf16"}
    assert [dest for spellings, dest, *_ in options if "cluster" in spellings[0]] == ["tpu_use_cluster"] * 2


def test_plugin_command_options_are_the_reference_commands_options():
    found = _reference_options()
    for command, (_, _, options) in cli_options.ACCELERATE_PLUGIN_COMMANDS.items():
        # the table holds each option's --snake_case spelling; the stand-in adds the --kebab-case twin
        snake = {spelling for option in found[command] for spelling in option if "-" not in spelling[2:]}
        assert {flag for flag, _, _ in options} == snake - {"--help", "-h"}, command
    tpu_options = cli_options.ACCELERATE_PLUGIN_COMMANDS["tpu-config"][2]
    assert [flag for flag, _, repeatable in tpu_options if repeatable] == ["--command"]
    assert [flag for flag, takes_value, _ in tpu_options if not takes_value] == [
        "--use_alpha",
        "--install_accelerate",
        "--debug",
    ]
