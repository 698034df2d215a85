"""``drivetrain launch``: start a script in N processes on M machines through torch's elastic launcher.

Each setting comes from, highest first: the command-line flag, the SLURM allocation (machine count, rank
and main address only, inside ``srun``), the config file, the default. The settings the user chose are
exported to the processes as ``DRIVETRAIN_*`` variables, which the kernel reads (``drivetrain.config.sources``);
a script's own ``Accelerator(...)`` argument that contradicts one is an error naming both.

Three modules: the options (launch_options.py), the plan they resolve to without side effects
(launch_plan.py), and here the supervision: exporting the plan's environment, handing the job to a backend's
own launcher or to torch's (launch_outcome.py), and Accelerate's ``accelerate.commands.launch`` entry points.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from drivetrain.commands.launch_options import (
    DESCRIPTION,
    HELP,
    KERNEL_ONLY,
    build_parser,
    parse_arguments,
    refuse_stand_ins,
    register_parser,
)
from drivetrain.commands.launch_plan import (  # noqa: F401  (re-exported: importable from here as before)
    LaunchPlan,
    backend_of_flag,
    banner,
    compile_and_placement_env,
    environment_for,
    first_host,
    resolve_plan,
    slurm_settings,
    torchrun_arguments,
)
from drivetrain.commands.parsing import UsageError, exit_code_of
from drivetrain.compat.install_hints import ACCELERATE_BACKEND_FLAGS
from drivetrain.errors import ConfigurationError
from drivetrain.launching.ports import free_port  # noqa: F401  (re-exported: importable from here as before)


def launch(plan: LaunchPlan, args: argparse.Namespace | None = None) -> int:
    """Start the processes and wait for them; return the exit code."""
    backend = plan.chosen.get("backend")
    if backend is not None:
        from drivetrain.contract.manager import get_plugin_manager

        # _check_backend loaded the backend's plugin, so the launcher it registers is known
        launcher = get_plugin_manager().extensions.launchers.get(backend)
        if launcher is not None:
            if args is not None and hasattr(args, KERNEL_ONLY):
                # Parsed with the kernel's options only: the launcher gets every plugin option, at its default.
                args = build_parser().parse_args(getattr(args, KERNEL_ONLY))
            os.environ.update(environment_for(plan))
            code = launcher[1](args if args is not None else plan, [plan.script, *plan.script_args])
            if code is not None:
                return int(code)
    if not plan.quiet:
        print(banner(plan), file=sys.stderr, flush=True)
    os.environ.update(environment_for(plan))
    from drivetrain.commands.launch_outcome import run_job

    return run_job(
        torchrun_arguments(plan),
        debug=bool(plan.chosen.get("debug")),
        announced=None if plan.quiet else plan.backend_label,
    )


def run(args: argparse.Namespace) -> int:
    if args.training_script.startswith("-"):
        raise UsageError(f"unknown option {args.training_script!r} (options go before the script)")
    if args.module and args.no_python:
        raise UsageError("-m runs a Python module and --no_python a program: use one of them")
    refuse_stand_ins(args)
    try:
        plan = resolve_plan(args)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    plan.env.update(compile_and_placement_env(args))
    return launch(plan, args)


def main(argv: Sequence[str] | None = None) -> int:
    """``drivetrain launch`` and ``python -m drivetrain.launch``."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    return exit_code_of(lambda: run(parse_arguments(arguments)))


# ---------------------------------------------------------------------------------------------------------------
# Accelerate's ``accelerate.commands.launch`` entry points, for tools that build or call the launcher.

#: Accelerate's log line format for the launcher.
FORMAT = "%(asctime)s - %(levelname)s - %(name)s - %(message)s"


def __getattr__(name: str) -> Any:
    from drivetrain.compat import cli_options, paths

    if name == "options_to_group":
        return dict(cli_options.ACCELERATE_LAUNCH_OPTION_GROUPS)
    if name == "logger":
        from drivetrain.logging import get_logger

        return get_logger(__name__)
    owned = paths.PLUGIN_NAMES_BY_PATH["accelerate.commands.launch"]
    if name in owned:
        from drivetrain.contract.reexport import plugin_name

        return plugin_name(name, owned[name], __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def clean_option(option: str) -> str | None:
    """``--num-processes`` -> ``num_processes`` (the ``dest`` of a long option); None for a short one."""
    from drivetrain.compat import cli_options

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
        parser = subparsers.add_parser("launch", help=HELP, description=DESCRIPTION)
        register_parser(parser)
    else:
        parser = build_parser()
    parser.set_defaults(func=launch_command)
    return parser


def launch_command(args: argparse.Namespace) -> None:
    """Launch from parsed arguments (Accelerate's entry point): returns when every process exited with 0;
    raises ``subprocess.CalledProcessError`` with the failing exit code otherwise, and ``UsageError`` (a
    ``ValueError``) for a bad option."""
    import subprocess

    code = run(args)
    if code:
        raise subprocess.CalledProcessError(
            code, [args.training_script, *getattr(args, "training_script_args", [])]
        )


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, None, bool]:
    """Accelerate's step that merges the config file into parsed arguments (tools call it): the settings the
    launch would use (flags, then the config file, then defaults) are written back onto ``args``. Returns
    ``(args, None, False)``, Accelerate's shape (drivetrain keeps no separate defaults)."""
    refuse_stand_ins(args)
    try:
        plan = resolve_plan(args)
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
    plan = resolve_plan(args)
    command = [sys.executable, *(["-m"] if plan.module else []), plan.script, *plan.script_args]
    if plan.no_python:
        command = [plan.script, *plan.script_args]
    environment = {**os.environ, **environment_for(plan)}
    if plan.chosen.get("use_cpu"):
        environment["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        environment["KMP_BLOCKTIME"] = str(getattr(args, "kmp_blocktime", 1) or 1)
    return command, environment


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment the launcher gives every process of the launch (Accelerate's helper). ``args`` may be
    a namespace built by hand: options it lacks take their defaults, and ``main_process_port=0`` picks a free
    port. The port chosen is left in ``args.master_port``, as Accelerate does."""
    for name, value in vars(build_parser().parse_args(["script.py"])).items():
        if not hasattr(args, name):
            setattr(args, name, value)
    _drop_options_of_unselected_backends(args)
    if args.main_process_port == 0:
        args.main_process_port = None
    plan = resolve_plan(args)
    args.master_port = str(plan.main_process_port)
    return {**os.environ, **environment_for(plan)}


def _drop_options_of_unselected_backends(args: argparse.Namespace) -> None:
    """Accelerate's launcher builds its namespace with every backend's options at its own defaults
    (``fsdp_offload_params=False``, ``megatron_lm_tp_degree=1``) and reads a backend's options only when that
    backend is selected; here such values would count as given for a backend that is not. So the options of a
    backend plugin the namespace does not select go back to drivetrain's defaults."""
    from drivetrain.contract.manager import get_plugin_manager

    selected = {backend_of_flag(flag) for flag in ACCELERATE_BACKEND_FLAGS if getattr(args, flag, False)}
    if args.backend is not None:
        selected.add(args.backend)
    manager = get_plugin_manager()
    defaults = getattr(args, "_plugin_option_defaults", {})
    for dest, plugin in getattr(args, "_plugin_option_owners", {}).items():
        if plugin not in selected and manager.info(plugin).kind == "backend":
            setattr(args, dest, defaults.get(dest))


#: Accelerate's launchers by kind; drivetrain's launcher chooses from the options and the installed backends.
simple_launcher = launch_command
multi_gpu_launcher = launch_command


if __name__ == "__main__":  # ``python -m drivetrain.commands.launch``
    sys.exit(main())
