"""``drivetrain launch``: start a script in N processes on M machines through torch's elastic launcher.

Each setting comes from, highest first: the command-line flag, the SLURM allocation (machine count, rank
and main address only, inside ``srun``), the config file, the default. The settings the user chose are
exported to the processes as ``DRIVETRAIN_*`` variables, which the kernel reads (``drivetrain.config.sources``);
a script's own ``Accelerator(...)`` argument that contradicts one is an error naming both.

Three modules: the options (launch_options.py), the plan they resolve to without side effects
(launch_plan.py), and here the supervision: exporting the plan's environment, handing the job to a backend's
own launcher or to torch's (launch_outcome.py). Accelerate's ``accelerate.commands.launch`` entry points
(``launch_command_parser``, ``launch_command``, ...) are in :mod:`drivetrain.compat.accelerate_commands.launch`;
this module serves them under Accelerate's path.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from drivetrain.commands.launch_options import (  # noqa: F401  (HELP, ...: the command's, importable here)
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
from drivetrain.contract.reexport import LOGGER, reexport
from drivetrain.errors import ConfigurationError
from drivetrain.launching.ports import free_port  # noqa: F401  (re-exported: importable from here as before)


def launch(plan: LaunchPlan, args: argparse.Namespace | None = None) -> int:
    """Start the processes and wait for them; return the exit code."""
    backend = plan.chosen.get("backend")
    if backend is not None:
        from drivetrain.contract.registry import get_plugin_registry

        # _check_backend loaded the backend's plugin, so the launcher it registers is known
        launcher = get_plugin_registry().extensions.launchers.get(backend)
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


# Accelerate's ``accelerate.commands.launch`` entry points (``launch_command_parser``, ``launch_command``, ...) live
# in drivetrain.compat.accelerate_commands.launch, code that exists only because Accelerate has it; this path serves
# them, each resolved on first use. That module calls this one (it sits above the commands), hence a table here
# rather than an import.
_ACCELERATE_ENTRY_POINTS = "drivetrain.compat.accelerate_commands.launch"
_ACCELERATE_NAMES = {
    **dict.fromkeys(
        (
            "FORMAT",
            "options_to_group",
            "clean_option",
            "CustomHelpFormatter",
            "launch_command_parser",
            "launch_command",
            "_validate_launch_command",
            "prepare_simple_launcher_cmd_env",
            "prepare_multi_gpu_env",
            "simple_launcher",
            "multi_gpu_launcher",
        ),
        _ACCELERATE_ENTRY_POINTS,
    ),
    "logger": LOGGER,
}
# Accelerate's launchers that plugins provide (deepspeed_launcher, ...) come from compat.paths' table for this path.
__getattr__, _accelerate_dir, _ = reexport(__name__, _ACCELERATE_NAMES)


def __dir__() -> list[str]:
    return sorted({*globals(), *_accelerate_dir()})


if __name__ == "__main__":  # ``python -m drivetrain.commands.launch``
    sys.exit(main())
