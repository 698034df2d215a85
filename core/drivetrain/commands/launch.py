"""``drivetrain launch``: start a script in N processes on M machines through torch's elastic launcher.

Each setting comes from, highest first: the command-line flag, the SLURM allocation (machine count, rank
and main address only, inside ``srun``), the config file, the default. The settings the user chose are
exported to the processes as ``DRIVETRAIN_*`` variables, which the kernel reads (``drivetrain.config.sources``);
a script's own ``Accelerator(...)`` argument that contradicts one is an error naming both.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from drivetrain import rank_guard
from drivetrain.commands.parsing import (
    ArgumentParser,
    UsageError,
    add_option,
    exit_code_of,
)
from drivetrain.compat.names import ACCELERATE_BACKEND_FLAGS, MULTIPROCESS_BACKEND_DISTRIBUTION
from drivetrain.config.file import KEYS, PRECISIONS, RDZV_BACKENDS, ConfigFile, load_config
from drivetrain.config.sources import BACKEND_CONFIG_ENV, PLUGIN_OPTIONS_ENV
from drivetrain.errors import ConfigurationError, PluginError
from drivetrain.launchers import free_port

#: What ParallelismConfig reads in the processes (drivetrain.config.parallelism's ENV_PREFIX and USE_ENV).
PARALLELISM_ENV_PREFIX = "DRIVETRAIN_PARALLELISM_CONFIG_"
USE_PARALLELISM_ENV = "DRIVETRAIN_USE_PARALLELISM_CONFIG"

HELP = "Launch a script in several processes and machines (torch's elastic launcher)."
#: --help's text: what the command does, and that every flag takes either spelling (as Accelerate's says).
DESCRIPTION = (
    f"{HELP} Flags may be written with hyphens (`--num-processes=2`) or underscores (`--num_processes=2`)."
)
DEFAULT_MULTI_NODE_PORT = 29500

#: launch setting -> the environment variable the kernel reads.
EXPORTED = {
    "backend": "DRIVETRAIN_BACKEND",
    "mixed_precision": "DRIVETRAIN_MIXED_PRECISION",
    "gradient_accumulation_steps": "DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS",
    "use_cpu": "DRIVETRAIN_CPU",
    "dynamo_backend": "DRIVETRAIN_DYNAMO_BACKEND",
    "debug": "DRIVETRAIN_DEBUG_MODE",
}


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
    from drivetrain.contract.manager import get_plugin_manager

    manager = get_plugin_manager()
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
    from drivetrain.compat.names import ACCELERATE_LAUNCH_PLUGIN_OPTIONS

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


def _refuse_stand_ins(args: argparse.Namespace) -> None:
    for dest, distribution in getattr(args, "_accelerate_stand_ins", {}).items():
        if getattr(args, dest, None) is not None:
            flag = "--" + dest
            raise UsageError(f"{flag} is read by a plugin that is not installed: pip install {distribution}")
    if getattr(args, "dynamo_use_regional_compilation", False):
        raise UsageError(
            "--dynamo_use_regional_compilation is not supported by drivetrain launch yet: compile regions in the "
            "script with drivetrain.utils.compile_regions(model)"
        )


def _compile_and_placement_env(args: argparse.Namespace) -> dict[str, str]:
    """Variables for the options the processes read themselves (Accelerate's names: ``TorchDynamoPlugin``
    reads the compile settings from them; ``PartialState`` pins the process)."""
    env = {}
    if getattr(args, "dynamo_mode", None):
        env["ACCELERATE_DYNAMO_MODE"] = args.dynamo_mode
    if getattr(args, "dynamo_use_fullgraph", False):
        env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = "1"
    if getattr(args, "dynamo_use_dynamic", False):
        env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = "1"
    if getattr(args, "enable_cpu_affinity", False):
        env["DRIVETRAIN_CPU_AFFINITY"] = "1"
    return env


# -- resolving the settings --------------------------------------------------------------------------------------
@dataclasses.dataclass
class LaunchPlan:
    """Everything needed to start the processes, after flags, SLURM, the config file and defaults."""

    script: str
    script_args: list[str]
    #: settings the user chose (flag or file), exported to the processes
    chosen: dict[str, Any]
    num_processes: int
    num_machines: int
    machine_rank: int
    main_process_ip: str
    main_process_port: int
    rdzv_backend: str
    rdzv_conf: str | None = None
    max_restarts: int = 0
    monitor_interval: float = 0.1
    module: bool = False
    no_python: bool = False
    role: str | None = None
    tee: str | None = None
    log_dir: str | None = None
    backend_label: str = "local"
    device: str = "cpu"
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    plugin_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    config_path: str | None = None
    quiet: bool = False

    @property
    def nproc_per_node(self) -> int:
        return self.num_processes // self.num_machines


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``node[07-09,12],gpu1`` -> ``node07``."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ConfigurationError(f"cannot read a host name from the SLURM node list {nodelist!r}")
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def slurm_settings(environ: dict[str, str]) -> dict[str, Any]:
    """Machine count, this machine's rank and the main address inside an ``srun`` step; empty elsewhere
    (in the batch script itself every line runs on the first node only, so nothing is read there)."""
    if "SLURM_STEP_ID" not in environ or "SLURM_NNODES" not in environ:
        return {}
    found: dict[str, Any] = {"num_machines": int(environ["SLURM_NNODES"])}
    rank = environ.get("SLURM_NODEID", environ.get("SLURM_PROCID"))
    if rank is not None:
        found["machine_rank"] = int(rank)
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if nodelist:
        found["main_process_ip"] = first_host(nodelist)
    return found


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"--env expects KEY=VALUE with a valid variable name, got {pair!r}")
        env[key] = value
    return env


def _check_backend(name: str, source: str) -> None:
    from drivetrain.contract.manager import get_plugin_manager, unknown_plugin_message

    manager = get_plugin_manager()
    if name not in manager.discovered():
        raise UsageError(f"{source}: {unknown_plugin_message(name, manager.discovered())}")
    kind = manager.info(name).kind
    if kind != "backend":
        raise UsageError(
            f"{source}: plugin {name!r} is a {kind} plugin, not a distribution backend; backends installed: "
            f"{', '.join(manager.plugins_of_kind('backend'))}"
        )


def _automatic_backend(world_size: int) -> str:
    """What the kernel will select when nothing names a backend (the rule of state.select_backend)."""
    from drivetrain.contract.info import REFERENCE_BACKEND
    from drivetrain.contract.manager import get_plugin_manager

    if world_size <= 1:
        return REFERENCE_BACKEND
    backend = get_plugin_manager().multiprocess_backend()
    if backend is None:
        raise UsageError(
            f"{world_size} processes need a multi-process backend, and none is installed "
            f"(pip install {MULTIPROCESS_BACKEND_DISTRIBUTION})"
        )
    return backend


def _backend_of_flag(flag: str) -> str:
    """The installed backend that declares Accelerate's flag ``--flag``; a UsageError naming the distribution
    to install when none does."""
    from drivetrain.contract.manager import get_plugin_manager

    backend = get_plugin_manager().backend_for_flag(flag)
    if backend is None:
        raise UsageError(
            f"--{flag} selects a backend plugin that is not installed: pip install {ACCELERATE_BACKEND_FLAGS[flag]}"
        )
    return backend


def resolve_plan(args: argparse.Namespace, environ: dict[str, str] | None = None) -> LaunchPlan:
    """Merge flags, SLURM, the config file and defaults into a :class:`LaunchPlan`; raise on bad values."""
    environ = dict(os.environ if environ is None else environ)
    from drivetrain.contract.manager import get_plugin_manager

    manager = get_plugin_manager()
    config: ConfigFile = load_config(args.config_file, plugins=manager.config_declarations)
    slurm = slurm_settings(environ)

    flag_backends = [
        _backend_of_flag(flag) for flag in ACCELERATE_BACKEND_FLAGS if getattr(args, flag, False)
    ]
    if args.backend is not None:
        flag_backends.insert(0, args.backend)
    if len(set(flag_backends)) > 1:
        raise UsageError(f"conflicting backend flags: {', '.join(sorted(set(flag_backends)))}; choose one")

    flags: dict[str, Any] = {
        "backend": flag_backends[0] if flag_backends else None,
        "use_cpu": args.cpu,
        "debug": args.debug,
    }
    for key in (
        "num_processes",
        "num_machines",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "rdzv_backend",
        "rdzv_conf",
        "max_restarts",
        "monitor_interval",
        "mixed_precision",
        "gradient_accumulation_steps",
        "dynamo_backend",
        "gpu_ids",
        "num_cpu_threads_per_process",
        "same_network",
    ):
        flags[key] = getattr(args, key)
    if flags["dynamo_backend"] is not None:
        try:
            flags["dynamo_backend"] = KEYS["dynamo_backend"](flags["dynamo_backend"])
        except ValueError as exc:
            raise UsageError(f"--dynamo_backend: {exc}, got {args.dynamo_backend!r}") from None

    def pick(key: str, default: Any = None, use_slurm: bool = False) -> tuple[Any, str]:
        if flags.get(key) is not None:
            return flags[key], "flag"
        if use_slurm and key in slurm:
            return slurm[key], "slurm"
        if config.get(key) is not None:
            return config.get(key), "file"
        return default, "default"

    chosen: dict[str, Any] = {}
    for key in EXPORTED:
        value, source = pick(key)
        if source != "default":
            chosen[key] = value
    if "backend" in chosen:
        _check_backend(chosen["backend"], "--backend" if flags["backend"] else f"config file {config.path}")

    import torch

    cpu = bool(chosen.get("use_cpu", False))
    gpu_ids, _ = pick("gpu_ids")
    gpus = 0 if cpu or not torch.cuda.is_available() else torch.cuda.device_count()
    if gpu_ids not in (None, "all") and gpus:
        gpus = len([part for part in str(gpu_ids).split(",") if part.strip()])
    num_machines, _ = pick("num_machines", 1, use_slurm=True)
    machine_rank, _ = pick("machine_rank", 0, use_slurm=True)
    num_processes, _ = pick("num_processes", max(gpus, 1) * num_machines)
    if num_processes % num_machines:
        raise UsageError(
            f"--num_processes {num_processes} is the total over all machines and must be a multiple of "
            f"--num_machines {num_machines}"
        )
    if machine_rank >= num_machines:
        raise UsageError(f"--machine_rank {machine_rank} must be below --num_machines {num_machines}")
    main_ip, ip_source = pick("main_process_ip", None, use_slurm=True)
    if num_machines > 1 and main_ip is None:
        raise UsageError(
            f"--num_machines {num_machines} needs --main_process_ip (the address of the machine of rank 0)"
        )
    main_ip = main_ip or "127.0.0.1"
    port, _ = pick("main_process_port")
    if port is None:
        port = DEFAULT_MULTI_NODE_PORT if num_machines > 1 else free_port(main_ip)
    max_restarts, _ = pick("max_restarts", 0)
    # A static rendezvous cannot form the group again after a failure; c10d can (torchrun --standalone
    # uses it on one machine too), so it is the default wherever it needs no extra setup or restarts are on.
    rdzv_backend, rdzv_source = pick(
        "rdzv_backend", "c10d" if num_machines == 1 or max_restarts else "static"
    )
    if rdzv_backend == "static" and max_restarts and rdzv_source != "default":
        raise UsageError(
            f"--max_restarts {max_restarts} needs --rdzv_backend c10d: a static rendezvous cannot "
            "form the process group again after a failure"
        )
    monitor_interval, _ = pick("monitor_interval", 0.1)

    env = {str(k): _environment_value(f"env.{k}", v) for k, v in (config.get("env") or {}).items()}
    env.update(_parse_env(args.env))
    threads, _ = pick("num_cpu_threads_per_process")
    if threads is not None:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    if gpu_ids not in (None, "all") and not cpu:
        env.setdefault("CUDA_VISIBLE_DEVICES", str(gpu_ids))

    parallelism = _parallelism_settings(args, config)
    if parallelism:
        from drivetrain.config.parallelism import section_product

        if section_product(parallelism) != num_processes:
            sizes = ", ".join(f"{key}={value}" for key, value in parallelism.items() if key.endswith("_size"))
            raise UsageError(
                f"parallelism sizes ({sizes}) multiply to {section_product(parallelism)} but --num_processes is "
                f"{num_processes}; make the product equal to the number of processes"
            )
        chosen["parallelism_config"] = parallelism
    elif getattr(args, "use_parallelism_config", None):
        chosen["parallelism_config"] = {}

    backend = chosen.get("backend")
    plugin_options = _merged(config.get("plugin_options") or {}, _plugin_option_values(args))
    if backend is not None:
        backend_label = backend
    elif num_processes > 1 and args.quiet and not plugin_options:
        # Nothing here needs the automatic backend (no banner names it, no plugin option is checked against
        # it), and each process selects it by the same rule (state.select_backend), reporting there when no
        # backend handles several processes. Working it out here would import plugin modules for nothing.
        backend_label = "automatic"
    else:
        backend_label = f"{_automatic_backend(num_processes)} (automatic)"
    backend_config = dict(config.get("backend_config") or {})
    if plugin_options:
        running = backend or _automatic_backend(num_processes)
        for plugin, values in plugin_options.items():
            _check_plugin_options(plugin, values, running)
            if plugin == running:
                backend_config.update(values)
    if backend_config:
        if backend is None and config.get("backend_config"):
            raise UsageError(
                f"config file {config.path} has a backend_config section but names no backend; add `backend:`"
            )
        chosen["backend_config"] = backend_config

    return LaunchPlan(
        script=args.training_script,
        script_args=list(args.training_script_args),
        chosen=chosen,
        num_processes=num_processes,
        num_machines=num_machines,
        machine_rank=machine_rank,
        main_process_ip=main_ip,
        main_process_port=port,
        rdzv_backend=rdzv_backend,
        rdzv_conf=pick("rdzv_conf")[0],
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        module=args.module,
        no_python=args.no_python,
        role=args.role,
        tee=args.tee,
        log_dir=args.log_dir,
        backend_label=backend_label,
        device="cpu" if not gpus else "cuda",
        env=env,
        plugin_options=plugin_options,
        config_path=str(config.path) if config.path else None,
        quiet=args.quiet,
    )


def _parallelism_settings(args: argparse.Namespace, config: ConfigFile) -> dict[str, Any]:
    """The ParallelismConfig settings: each ``--parallelism_config_*`` flag over the config file's section."""
    from drivetrain.config.parallelism import check_section

    flags = {
        name: getattr(args, f"parallelism_config_{name}", None)
        for name in PARALLELISM_FLAGS
        if getattr(args, f"parallelism_config_{name}", None) is not None
    }
    try:
        from_flags = check_section(flags)
    except ValueError as exc:
        raise UsageError(f"--parallelism_config_*: {exc}") from None
    return {**(config.get("parallelism_config") or {}), **from_flags}


def _plugin_option_values(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Values the user set for options that plugins added, by plugin."""
    found: dict[str, dict[str, Any]] = {}
    defaults = getattr(args, "_plugin_option_defaults", {})
    for dest, plugin in getattr(args, "_plugin_option_owners", {}).items():
        value = getattr(args, dest, None)
        if value is not None and value != defaults.get(dest):
            found.setdefault(plugin, {})[dest] = value
    return found


def _merged(
    from_file: dict[str, dict[str, Any]], from_flags: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each plugin's options from the config file, overridden by the flags the user set."""
    merged = {plugin: dict(values) for plugin, values in from_file.items()}
    for plugin, values in from_flags.items():
        merged.setdefault(plugin, {}).update(values)
    return merged


def _check_plugin_options(plugin: str, values: dict[str, Any], backend: str) -> None:
    from drivetrain.contract.manager import get_plugin_manager

    if get_plugin_manager().info(plugin).kind == "backend" and plugin != backend:
        names = ", ".join("--" + dest for dest in values)
        raise UsageError(
            f"{names}: option(s) of backend {plugin!r}, but the backend is {backend!r}; "
            f"add --backend {plugin}"
        )


# -- running -------------------------------------------------------------------------------------------------------
def _environment_value(field: str, value: Any) -> str:
    """A config value as an environment variable: strings and numbers as written, booleans as 1/0, lists
    comma-separated (``gpu_ids: [0, 1]`` -> ``0,1``); anything else (null, a mapping) is an error naming the
    field, rather than its Python repr reaching the processes."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (str, int, float)):
        return str(value)
    if isinstance(value, (list, tuple)) and all(
        isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in value
    ):
        return ",".join(str(item) for item in value)
    shown = "null" if value is None else type(value).__name__
    raise ConfigurationError(
        f"config field {field} is {shown}; an environment variable needs a string, a number, true/false or a "
        "list of strings/numbers (joined with commas). Remove the line to leave the variable unset"
    )


def environment_for(plan: LaunchPlan) -> dict[str, str]:
    """The variables the launcher adds to the processes' environment."""
    env: dict[str, str] = {}
    for key, variable in EXPORTED.items():
        if key in plan.chosen:
            value = plan.chosen[key]
            if value is not None:
                env[variable] = _environment_value(key, value)
    if "parallelism_config" in plan.chosen:
        env[USE_PARALLELISM_ENV] = "1"
        for name, value in plan.chosen["parallelism_config"].items():
            env[PARALLELISM_ENV_PREFIX + name.upper()] = str(value)
    if "backend_config" in plan.chosen:
        env[BACKEND_CONFIG_ENV] = json.dumps(plan.chosen["backend_config"], sort_keys=True)
    if plan.plugin_options:
        env[PLUGIN_OPTIONS_ENV] = json.dumps(plan.plugin_options, sort_keys=True, default=str)
    env.update(plan.env)
    return env


def torchrun_arguments(plan: LaunchPlan) -> list[str]:
    """The same job as torchrun's command line (parsed by torch.distributed.run itself), each process
    started through the rank guard."""
    argv = [
        f"--nnodes={plan.num_machines}",
        f"--nproc_per_node={plan.nproc_per_node}",
        f"--rdzv_backend={plan.rdzv_backend}",
        f"--max_restarts={plan.max_restarts}",
        f"--monitor_interval={plan.monitor_interval}",
    ]
    if plan.rdzv_backend == "static":
        argv += [
            f"--node_rank={plan.machine_rank}",
            f"--master_addr={plan.main_process_ip}",
            f"--master_port={plan.main_process_port}",
        ]
    else:
        run_id = os.environ.get("SLURM_JOB_ID", "drivetrain")
        argv += [f"--rdzv_endpoint={plan.main_process_ip}:{plan.main_process_port}", f"--rdzv_id={run_id}"]
    if plan.rdzv_conf:
        argv.append(f"--rdzv_conf={plan.rdzv_conf}")
    if plan.role:
        argv.append(f"--role={plan.role}")
    if plan.tee:
        argv.append(f"--tee={plan.tee}")
    # torch makes a log folder per run in the temporary folder unless told where; /dev/null: none at all
    argv.append(f"--log_dir={plan.log_dir or os.devnull}")
    if plan.no_python:
        command = [plan.script, *plan.script_args]
    else:  # torchrun's own command for a script (PYTHON_EXEC is torchrun's way to name the interpreter)
        python = os.environ.get("PYTHON_EXEC", sys.executable)
        command = [python, "-u", *(["-m"] if plan.module else []), plan.script, *plan.script_args]
    # each process dies with this launcher, whatever ends it (rank_guard.py)
    return [*argv, "--no_python", *rank_guard.guarded(command)]


def banner(plan: LaunchPlan) -> str:
    total = plan.num_processes
    machines = f"{plan.num_machines} machine{'s' if plan.num_machines > 1 else ''}"
    where = f", this is machine {plan.machine_rank}" if plan.num_machines > 1 else ""
    precision = plan.chosen.get("mixed_precision", "no (unless the script asks)")
    config = f", config {plan.config_path}" if plan.config_path else ""
    return (
        f"drivetrain launch: backend {plan.backend_label}, {total} process{'es' if total > 1 else ''} on "
        f"{machines} ({plan.nproc_per_node} here, {plan.device}){where}, precision {precision}{config}"
    )


def launch(plan: LaunchPlan, args: argparse.Namespace | None = None) -> int:
    """Start the processes and wait for them; return the exit code."""
    backend = plan.chosen.get("backend")
    if backend is not None:
        from drivetrain.contract.manager import get_plugin_manager

        # _check_backend loaded the backend's plugin, so the launcher it registers is known
        launcher = get_plugin_manager().extensions.launchers.get(backend)
        if launcher is not None:
            if args is not None and hasattr(args, _KERNEL_ONLY):
                # Parsed with the kernel's options only: the launcher gets every plugin option, at its default.
                args = build_parser().parse_args(getattr(args, _KERNEL_ONLY))
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
    _refuse_stand_ins(args)
    try:
        plan = resolve_plan(args)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    plan.env.update(_compile_and_placement_env(args))
    return launch(plan, args)


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
_KERNEL_ONLY = "_kernel_only_command_line"


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
    setattr(args, _KERNEL_ONLY, list(argv))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """``drivetrain launch`` and ``python -m drivetrain.launch``."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    return exit_code_of(lambda: run(parse_arguments(arguments)))


# ---------------------------------------------------------------------------------------------------------------
# Accelerate's ``accelerate.commands.launch`` entry points, for tools that build or call the launcher.

#: Accelerate's log line format for the launcher.
FORMAT = "%(asctime)s - %(levelname)s - %(name)s - %(message)s"


def __getattr__(name: str) -> Any:
    from drivetrain.compat import names

    if name == "options_to_group":
        return dict(names.ACCELERATE_LAUNCH_OPTION_GROUPS)
    if name == "logger":
        from drivetrain.logging import get_logger

        return get_logger(__name__)
    owned = names.PLUGIN_NAMES_BY_PATH["accelerate.commands.launch"]
    if name in owned:
        from drivetrain.contract.reexport import plugin_name

        return plugin_name(name, owned[name], __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def clean_option(option: str) -> str | None:
    """``--num-processes`` -> ``num_processes`` (the ``dest`` of a long option); None for a short one."""
    from drivetrain.compat import names

    if names.ACCELERATE_PRECISION_BACKEND_OPTION in option:
        option = "--" + names.ACCELERATE_PRECISION_BACKEND_OPTION
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
    _refuse_stand_ins(args)
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

    selected = {_backend_of_flag(flag) for flag in ACCELERATE_BACKEND_FLAGS if getattr(args, flag, False)}
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
