"""Every option of the reference's commands (peer/reference_cli.json, from accelerate==1.15.0's own parsers) is
accepted by ``drivetrain``'s: implemented, read by the plugin that implements it, or refused in one line naming
the plugin to install. Accelerate's entry points (``launch_command_parser``, ``python -m
drivetrain.commands.launch``) exist."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from drivetrain.commands import main as cli
from peer import names as reference

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _spellings(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


@pytest.fixture(scope="module")
def parsers():
    from drivetrain.commands.launch import launch_command_parser

    top = cli.build_parser()
    (sub,) = [action for action in top._actions if isinstance(action, argparse._SubParsersAction)]
    found = {name: parser for name, parser in sub.choices.items()}
    (config_sub,) = [a for a in found["config"]._actions if isinstance(a, argparse._SubParsersAction)]
    found["config default"] = config_sub.choices["default"]
    found["config update"] = config_sub.choices["update"]
    found["launch"] = launch_command_parser()
    return found


def test_every_reference_option_is_accepted(parsers):
    snapshot = json.loads(reference.CLI_SNAPSHOT.read_text())
    missing = {
        command: sorted(
            spelling
            for option in options
            for spelling in option
            if spelling.startswith("-") and spelling not in _spellings(parsers[command])
        )
        for command, options in snapshot.items()
    }
    assert not {command: flags for command, flags in missing.items() if flags}


def test_an_option_of_a_plugin_that_is_not_installed_is_refused_in_one_line_naming_it():
    result = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.launch", "--megatron-lm-tp-degree", "2", "train.py"],
        capture_output=True,
        text=True,
        # as on a machine without drivetrain-megatron (this checkout installs every plugin)
        env={**os.environ, "DRIVETRAIN_LOAD_PLUGINS": "ddp"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "drivetrain: error: --megatron_lm_tp_degree is read by a plugin that is not installed: pip install "
        "drivetrain-megatron"
    ]


def test_launch_command_runs_a_script_from_parsed_arguments(tmp_path):
    from drivetrain.commands.launch import _validate_launch_command, launch_command, launch_command_parser

    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(
        f"import os, pathlib\npathlib.Path({str(marker)!r}).write_text(os.environ['WORLD_SIZE'])\n"
    )
    args = launch_command_parser().parse_args(["--cpu", "--num-processes", "1", "--quiet", str(script)])
    validated, _, _ = _validate_launch_command(args)
    assert validated.num_processes == 1 and validated.cpu
    launch_command(args)
    assert marker.read_text() == "1"
    failing = tmp_path / "fail.py"
    failing.write_text("raise SystemExit(3)\n")
    with pytest.raises(subprocess.CalledProcessError):
        launch_command(launch_command_parser().parse_args(["--cpu", "--quiet", str(failing)]))


def test_compile_options_reach_the_processes(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "from drivetrain import Accelerator\n"
        "plugin = Accelerator(cpu=True).state.dynamo_plugin\n"
        "print('DYNAMO', plugin.mode, plugin.fullgraph, plugin.dynamic)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.launch", "--cpu", "--quiet", "--dynamo-mode", "max-autotune",
         "--dynamo_use_fullgraph", "--dynamo-use-dynamic", str(script)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "DYNAMO max-autotune True True" in result.stdout
