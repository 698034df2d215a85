"""``drivetrain launch``'s options: the argparse parser (the kernel's options, every plugin's, and Accelerate's
options of plugins that are not installed), and the parse that imports plugin modules only when it needs them.
What the options resolve to is launch_plan.py; starting the processes is launch.py."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from drivetrain.commands.parsing import ArgumentParser, UsageError, add_option
from drivetrain.compat.install_hints import ACCELERATE_BACKEND_FLAGS
from drivetrain.config.file import PRECISIONS, RDZV_BACKENDS
from drivetrain.errors import PluginError

HELP = "Launch a script in several processes and machines (torch's elastic launcher)."
#: --help's text: what the command does, and that every flag takes either spelling (as Accelerate's says).
DESCRIPTION = (
    f"{HELP} Flags may be written with hyphens (`--num-processes=2`) or underscores (`--num_processes=2`)."
)
DEFAULT_MULTI_NODE_PORT = 29500

#: ``--parallelism_config_<name>`` flags (Accelerate's) -> help. Exported to the processes as
#: ``DRIVETRAIN_PARALLELISM_CONFIG_<NAME>``, which ``ParallelismConfig`` reads.
PARALLELISM_FLAGS = {
    "dp_replicate_size": "processes per data-parallel replica group (full copies, gradients all-reduced)",
    "dp_shard_size": "processes parameters, gradients and optimizer state are sharded over",
    "tp_size": "processes each weight matrix is split over (tensor parallelism)",
    "cp_size": "processes each sequence is split over (context parallelism)",
    "cp_backend": "context-parallel implementation: torch",
    "cp_comm_strategy": "how context-parallel ranks exchange keys/values: allgather or alltoall",
    "sp_size": "sequence-parallel size of a backend that runs its own groups",
    "sp_backend": "sequence-parallel implementation of that backend",
}


# -- the parser ------------------------------------------------------------------------------------------------
def register_parser(parser: argparse.ArgumentParser, plugin_options: bool = True) -> None:
    """Add the launcher's options to ``parser``; with ``plugin_options``, also every plugin's (which imports
    every plugin module)."""
    script = parser.add_argument_group("script")
    script.add_argument(
        "training_script",
        help="the script to run (a module name with -m, a program with --no_python), then its own arguments",
    )
    script.add_argument("training_script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    add_option(
        script,
        "-m",
        "--module",
        action="store_true",
        help="run the script as a Python module, like `python -m`",
    )
    add_option(
        script,
        "--no_python",
        action="store_true",
        help="run the script directly, without `python` in front (any program)",
    )
    add_option(
        script,
        "--config_file",
        metavar="PATH",
        help="config file with the default values (default: the one `drivetrain config` wrote)",
    )
    add_option(
        script,
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an environment variable in every process (repeatable)",
    )
    add_option(
        script,
        "--debug",
        action="store_true",
        default=None,
        help="debug mode: check collectives' shapes across processes, show full launcher errors",
    )
    add_option(script, "-q", "--quiet", action="store_true", help="no start banner")

    hardware = parser.add_argument_group("hardware and backend")
    add_option(
        hardware,
        "--backend",
        metavar="NAME",
        help="distribution backend plugin (default: `local` for "
        "one process, the installed multi-process backend for several)",
    )
    add_option(
        hardware, "--cpu", action="store_true", default=None, help="compute on the CPU even if a GPU is there"
    )
    add_option(hardware, "--multi_gpu", action="store_true", help="Accelerate's flag; processes use the GPUs")
    for flag in ACCELERATE_BACKEND_FLAGS:
        add_option(
            hardware,
            f"--{flag}",
            action="store_true",
            help="Accelerate's flag: selects the backend plugin that declares it",
        )
    add_option(hardware, "--gpu_ids", metavar="IDS", help="comma-separated GPU ids to use on this machine")

    resources = parser.add_argument_group("processes and precision")
    add_option(
        resources,
        "--num_processes",
        type=_int_option("--num_processes", 1),
        metavar="N",
        help="total processes over all machines (default: one per GPU, else 1)",
    )
    add_option(
        resources,
        "--mixed_precision",
        type=_choice_option("--mixed_precision", PRECISIONS),
        metavar="{" + ",".join(PRECISIONS) + "}",
        help="mixed precision mode",
    )
    add_option(
        resources,
        "--gradient_accumulation_steps",
        type=_int_option("--gradient_accumulation_steps", 1),
        metavar="N",
        help="steps to accumulate gradients over",
    )
    add_option(resources, "--dynamo_backend", metavar="NAME", help="torch.compile backend (e.g. inductor)")
    add_option(
        resources,
        "--num_cpu_threads_per_process",
        type=_int_option("--num_cpu_threads_per_process", 1),
        metavar="N",
        help="OMP_NUM_THREADS of each process",
    )

    machines = parser.add_argument_group("multi-node (read from SLURM inside srun when unset)")
    add_option(
        machines,
        "--num_machines",
        type=_int_option("--num_machines", 1),
        metavar="M",
        help="number of machines (default 1)",
    )
    add_option(
        machines,
        "--machine_rank",
        type=_int_option("--machine_rank", 0),
        metavar="R",
        help="this machine's rank, 0 on the main machine",
    )
    add_option(machines, "--main_process_ip", metavar="IP", help="address of the machine of rank 0")
    add_option(
        machines,
        "--main_process_port",
        type=_int_option("--main_process_port", 1, 65535),
        metavar="PORT",
        help=f"port on the main machine (default: a free port on one machine, {DEFAULT_MULTI_NODE_PORT} on several)",
    )
    add_option(
        machines,
        "--rdzv_backend",
        type=_choice_option("--rdzv_backend", RDZV_BACKENDS),
        metavar="{static,c10d}",
        help="rendezvous: c10d (default on one machine or with --max_restarts) or static (fixed "
        "ranks, default on several machines)",
    )
    add_option(machines, "--rdzv_conf", metavar="K=V,...", help="extra rendezvous settings")
    add_option(
        machines,
        "--same_network",
        action="store_true",
        default=None,
        help="Accelerate's flag: all machines are on one network (informational)",
    )

    parallelism = parser.add_argument_group(
        "N-D parallelism (ParallelismConfig; its sizes must multiply to --num_processes)"
    )
    add_option(
        parallelism,
        "--use_parallelism_config",
        action="store_true",
        default=None,
        help="Accelerate's flag: build a ParallelismConfig in the processes (implied by any flag below)",
    )
    for name, help_text in PARALLELISM_FLAGS.items():
        add_option(parallelism, f"--parallelism_config_{name}", metavar="VALUE", help=help_text)

    faults = parser.add_argument_group("fault tolerance and logs")
    add_option(
        faults,
        "--max_restarts",
        type=_int_option("--max_restarts", 0),
        metavar="N",
        help="restart the whole process group up to N times when a process fails (default 0)",
    )
    add_option(
        faults,
        "--monitor_interval",
        type=_float_option("--monitor_interval"),
        metavar="SECONDS",
        help="how often the launcher checks on the processes (default 0.1)",
    )
    add_option(faults, "--role", metavar="NAME", help="name of the worker role in launcher logs")
    add_option(
        faults,
        "-t",
        "--tee",
        metavar="{0,1,2,3}",
        help="also copy process stdout(1)/stderr(2)/both(3) to files under --log_dir",
    )
    add_option(faults, "--log_dir", metavar="DIR", help="directory for the launcher's per-process log files")

    compile_group = parser.add_argument_group("torch.compile and processor placement (Accelerate's options)")
    add_option(
        compile_group,
        "--dynamo_mode",
        choices=("default", "reduce-overhead", "max-autotune"),
        help="torch.compile mode (with --dynamo_backend)",
    )
    add_option(
        compile_group, "--dynamo_use_fullgraph", action="store_true", help="torch.compile fullgraph=True"
    )
    add_option(compile_group, "--dynamo_use_dynamic", action="store_true", help="torch.compile dynamic=True")
    add_option(
        compile_group,
        "--dynamo_use_regional_compilation",
        action="store_true",
        help="compile repeated blocks one by one (not supported by drivetrain launch yet: refused when set)",
    )
    add_option(
        compile_group,
        "--enable_cpu_affinity",
        action="store_true",
        help="pin each process to its share of the machine's cores",
    )

    if plugin_options:
        _add_plugin_options(parser)
        _add_accelerate_stand_ins(parser)


def _int_option(flag: str, minimum: int, maximum: int | None = None):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects a whole number, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            raise argparse.ArgumentTypeError(f"{flag} must be {bound}, got {value}")
        return value

    return convert


def _float_option(flag: str):
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} expects a number of seconds > 0, got {text!r}")
        return value

    return convert


def _choice_option(flag: str, choices: Sequence[str]):
    def convert(text: str) -> str:
        if text.lower() not in choices:
            raise argparse.ArgumentTypeError(f"{flag} must be one of {', '.join(choices)}, got {text!r}")
        return text.lower()

    return convert


def _add_plugin_options(parser: argparse.ArgumentParser) -> None:
    """Options plugins add through ``registry.add_launch_options``; each plugin gets its own help section.
    The destinations each plugin added are remembered, so their values can be handed to that plugin."""
    from drivetrain.contract.registry import get_plugin_registry

    manager = get_plugin_registry()
    for name in manager.names():
        try:
            manager.load(name)
        except PluginError:
            continue  # `drivetrain plugins` says why; launching without it may still be what the user wants
    owners: dict[str, str] = {}
    defaults: dict[str, Any] = {}
    for plugin, add_arguments in manager.extensions.launch_options:
        group = parser.add_argument_group(f"options of plugin {plugin}")
        before = {action.dest for action in parser._actions}
        add_arguments(group)
        for action in parser._actions:
            if action.dest not in before:
                owners[action.dest] = plugin
                defaults[action.dest] = action.default
    parser.set_defaults(_plugin_option_owners=owners, _plugin_option_defaults=defaults)


def _add_accelerate_stand_ins(parser: argparse.ArgumentParser) -> None:
    """Accelerate's launch options that no installed plugin declares (accepted; a run that sets one is refused
    in one line naming the distribution that reads it), and the ``--kebab-case`` twin of every
    ``--snake_case`` option a plugin declared with one spelling only."""
    from drivetrain.compat.cli_options import ACCELERATE_LAUNCH_PLUGIN_OPTIONS

    group = parser.add_argument_group("Accelerate options of plugins that are not installed")
    owners: dict[str, str] = {}
    for spellings, dest, takes_value, distribution in ACCELERATE_LAUNCH_PLUGIN_OPTIONS:
        if any(spelling in parser._option_string_actions for spelling in spellings):
            continue  # an installed plugin declares it
        if takes_value:
            group.add_argument(*spellings, dest=dest, default=None, help=f"read by {distribution}")
        else:
            negative = spellings[0].startswith("--no")
            group.add_argument(
                *spellings,
                dest=dest,
                action="store_const",
                const=not negative,
                default=None,
                help=f"read by {distribution}",
            )
        owners[dest] = distribution
    parser.set_defaults(_accelerate_stand_ins=owners)
    # argparse keeps one action per spelling: a twin spelling points at the same action
    for spelling, action in list(parser._option_string_actions.items()):
        if spelling.startswith("--") and "_" in spelling:
            twin = "--" + spelling[2:].replace("_", "-")
            if twin not in parser._option_string_actions:
                parser._option_string_actions[twin] = action
                action.option_strings.append(twin)


def refuse_stand_ins(args: argparse.Namespace) -> None:
    for dest, distribution in getattr(args, "_accelerate_stand_ins", {}).items():
        if getattr(args, dest, None) is not None:
            flag = "--" + dest
            raise UsageError(f"{flag} is read by a plugin that is not installed: pip install {distribution}")
    if getattr(args, "dynamo_use_regional_compilation", False):
        raise UsageError(
            "--dynamo_use_regional_compilation is not supported by drivetrain launch yet: compile regions in the "
            "script with drivetrain.utils.compile_regions(model)"
        )


def build_parser(plugin_options: bool = True) -> ArgumentParser:
    """The ``drivetrain launch`` parser; ``plugin_options=False`` leaves out the plugins' options (and --help,
    whose text lists them), so that building it imports no plugin."""
    parser = ArgumentParser(
        prog="drivetrain launch",
        description=DESCRIPTION,
        usage="drivetrain launch [options] script.py [script arguments]",
        add_help=plugin_options,
    )
    register_parser(parser, plugin_options=plugin_options)
    return parser


#: Attribute of a namespace parsed without the plugins' options: the command line, to parse it again in full.
KERNEL_ONLY = "_kernel_only_command_line"


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``drivetrain launch``'s command line, importing plugin modules only when it needs them.

    Collecting the plugins' options means importing every plugin module, most of the launcher's own start-up
    time. So the kernel's options are tried first; anything they cannot parse (a plugin's option, --help, a
    misspelled flag, a bad value) is parsed again with every plugin's options, which accepts it or gives the
    error, as if there had been one parse. Unknown options before the script always fail the first parse
    (argparse never takes them for the script), so a plugin option is never silently dropped.
    """
    try:
        args = build_parser(plugin_options=False).parse_args(argv)
    except UsageError:
        return build_parser().parse_args(argv)
    setattr(args, KERNEL_ONLY, list(argv))
    return args
