"""Accelerate's ``accelerate.commands.launch`` entry points, for tools that build or call the launcher: the
``launch`` parser (``launch_command_parser``), launching from parsed arguments (``launch_command``, and
Accelerate's launchers by kind, which are the same here), merging the config file into parsed arguments
(``_validate_launch_command``) and the launchers' helpers. ``drivetrain.commands.launch`` serves each of these names
(a table there), so Accelerate's path holds them.

They reach ``drivetrain launch`` through :mod:`drivetrain.commands.launch` (``supervision.resolve_plan``, not the
module that defines it), so that patching a name there (``run``, ``resolve_plan``, ``build_parser``) reaches these
entry points as it did when they were defined in that module.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from drivetrain.commands import launch as supervision
from drivetrain.compat import cli_options
from drivetrain.compat.install_hints import ACCELERATE_BACKEND_FLAGS
from drivetrain.errors import ConfigurationError, UsageError

#: Accelerate's log line format for the launcher.
FORMAT = "%(asctime)s - %(levelname)s - %(name)s - %(message)s"

#: Accelerate's ``launch`` option groups by the option that opens them.
options_to_group = dict(cli_options.ACCELERATE_LAUNCH_OPTION_GROUPS)


def clean_option(option: str) -> str | None:
    """``--num-processes`` -> ``num_processes`` (the ``dest`` of a long option); None for a short one."""
    if cli_options.ACCELERATE_PRECISION_BACKEND_OPTION in option:
        option = "--" + cli_options.ACCELERATE_PRECISION_BACKEND_OPTION
    return option[2:].replace("-", "_") if option.startswith("--") else None


class CustomHelpFormatter(argparse.HelpFormatter):
    """Accelerate's help formatter name; drivetrain's launcher help already lists each option once, grouped."""


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``launch`` parser with every option (the plugins' included), added to ``subparsers`` when given;
    ``args.func`` is :func:`launch_command`. Accelerate's options are all accepted: implemented, read by the
    plugin that implements them, or refused in one line naming the plugin to install."""
    if subparsers is not None:
        parser = subparsers.add_parser("launch", help=supervision.HELP, description=supervision.DESCRIPTION)
        supervision.register_parser(parser)
    else:
        parser = supervision.build_parser()
    parser.set_defaults(func=launch_command)
    return parser


def launch_command(args: argparse.Namespace) -> None:
    """Launch from parsed arguments (Accelerate's entry point): returns when every process exited with 0;
    raises ``subprocess.CalledProcessError`` with the failing exit code otherwise, and ``UsageError`` (a
    ``ValueError``) for a bad option."""
    code = supervision.run(args)
    if code:
        raise subprocess.CalledProcessError(
            code, [args.training_script, *getattr(args, "training_script_args", [])]
        )


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, None, bool]:
    """Accelerate's step that merges the config file into parsed arguments (tools call it): the settings the
    launch would use (flags, then the config file, then defaults) are written back onto ``args``. Returns
    ``(args, None, False)``, Accelerate's shape (drivetrain keeps no separate defaults)."""
    supervision.refuse_stand_ins(args)
    try:
        plan = supervision.resolve_plan(args)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    for key in ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port"):
        if hasattr(plan, key):
            setattr(args, key, getattr(plan, key))
    for key, value in plan.chosen.items():
        if key == "use_cpu":
            args.cpu = bool(value)
        elif key in ("debug", "mixed_precision", "gradient_accumulation_steps", "dynamo_backend"):
            setattr(args, key, value)
    return args, None, False


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """``(command, environment)`` that runs the script of ``args`` as one process with the launch's settings
    (Accelerate's helper; with ``--cpu``, Intel OpenMP's affinity variables are set as Accelerate sets them)."""
    plan = supervision.resolve_plan(args)
    command = [sys.executable, *(["-m"] if plan.module else []), plan.script, *plan.script_args]
    if plan.no_python:
        command = [plan.script, *plan.script_args]
    environment = {**os.environ, **supervision.environment_for(plan)}
    if plan.chosen.get("use_cpu"):
        environment["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        environment["KMP_BLOCKTIME"] = str(getattr(args, "kmp_blocktime", 1) or 1)
    return command, environment


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment the launcher gives every process of the launch (Accelerate's helper). ``args`` may be
    a namespace built by hand: options it lacks take their defaults, and ``main_process_port=0`` picks a free
    port. The port chosen is left in ``args.master_port``, as Accelerate does."""
    for name, value in vars(supervision.build_parser().parse_args(["script.py"])).items():
        if not hasattr(args, name):
            setattr(args, name, value)
    _drop_options_of_unselected_backends(args)
    if args.main_process_port == 0:
        args.main_process_port = None
    plan = supervision.resolve_plan(args)
    args.master_port = str(plan.main_process_port)
    return {**os.environ, **supervision.environment_for(plan)}


def _drop_options_of_unselected_backends(args: argparse.Namespace) -> None:
    """Accelerate's launcher builds its namespace with every backend's options at its own defaults
    (``fsdp_offload_params=False``, ``megatron_lm_tp_degree=1``) and reads a backend's options only when that
    backend is selected; here such values would count as given for a backend that is not. So the options of a
    backend plugin the namespace does not select go back to drivetrain's defaults."""
    from drivetrain.contract.registry import get_plugin_registry

    selected = {
        supervision.backend_of_flag(flag) for flag in ACCELERATE_BACKEND_FLAGS if getattr(args, flag, False)
    }
    if args.backend is not None:
        selected.add(args.backend)
    manager = get_plugin_registry()
    defaults = getattr(args, "_plugin_option_defaults", {})
    for dest, plugin in getattr(args, "_plugin_option_owners", {}).items():
        if plugin not in selected and manager.info(plugin).kind == "backend":
            setattr(args, dest, defaults.get(dest))


#: Accelerate's launchers by kind; drivetrain's launcher chooses from the options and the installed backends.
simple_launcher = launch_command
multi_gpu_launcher = launch_command
