"""What a ``drivetrain launch`` will run, resolved without starting anything: flags, the SLURM allocation, the
config file and defaults merged into a :class:`LaunchPlan`, and from it the processes' environment and torch's
launcher command line. Nothing here changes this process's environment or starts a process (it imports the
plugins that the options name, to check them)."""

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
from drivetrain.commands.launch_options import DEFAULT_MULTI_NODE_PORT, PARALLELISM_FLAGS
from drivetrain.commands.parsing import UsageError
from drivetrain.compat.distributions import MULTIPROCESS_BACKEND_DISTRIBUTION
from drivetrain.compat.install_hints import ACCELERATE_BACKEND_FLAGS
from drivetrain.config.file import KEYS, ConfigFile, load_config
from drivetrain.config.sources import BACKEND_CONFIG_ENV, PLUGIN_OPTIONS_ENV
from drivetrain.errors import ConfigurationError
from drivetrain.launching.ports import free_port

#: What ParallelismConfig reads in the processes (drivetrain.config.parallelism's ENV_PREFIX and USE_ENV).
PARALLELISM_ENV_PREFIX = "DRIVETRAIN_PARALLELISM_CONFIG_"
USE_PARALLELISM_ENV = "DRIVETRAIN_USE_PARALLELISM_CONFIG"

#: launch setting -> the environment variable the kernel reads.
EXPORTED = {
    "backend": "DRIVETRAIN_BACKEND",
    "mixed_precision": "DRIVETRAIN_MIXED_PRECISION",
    "gradient_accumulation_steps": "DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS",
    "use_cpu": "DRIVETRAIN_CPU",
    "dynamo_backend": "DRIVETRAIN_DYNAMO_BACKEND",
    "debug": "DRIVETRAIN_DEBUG_MODE",
}


def compile_and_placement_env(args: argparse.Namespace) -> dict[str, str]:
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
    from drivetrain.contract.registry import get_plugin_registry, unknown_plugin_message

    manager = get_plugin_registry()
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
    from drivetrain.contract.registry import get_plugin_registry

    if world_size <= 1:
        return REFERENCE_BACKEND
    backend = get_plugin_registry().multiprocess_backend()
    if backend is None:
        raise UsageError(
            f"{world_size} processes need a multi-process backend, and none is installed "
            f"(pip install {MULTIPROCESS_BACKEND_DISTRIBUTION})"
        )
    return backend


def backend_of_flag(flag: str) -> str:
    """The installed backend that declares Accelerate's flag ``--flag``; a UsageError naming the distribution
    to install when none does."""
    from drivetrain.contract.registry import get_plugin_registry

    backend = get_plugin_registry().backend_for_flag(flag)
    if backend is None:
        raise UsageError(
            f"--{flag} selects a backend plugin that is not installed: pip install {ACCELERATE_BACKEND_FLAGS[flag]}"
        )
    return backend


def resolve_plan(args: argparse.Namespace, environ: dict[str, str] | None = None) -> LaunchPlan:
    """Merge flags, SLURM, the config file and defaults into a :class:`LaunchPlan`; raise on bad values."""
    environ = dict(os.environ if environ is None else environ)
    from drivetrain.contract.registry import get_plugin_registry

    manager = get_plugin_registry()
    config: ConfigFile = load_config(args.config_file, plugins=manager.config_declarations)
    slurm = slurm_settings(environ)

    flag_backends = [backend_of_flag(flag) for flag in ACCELERATE_BACKEND_FLAGS if getattr(args, flag, False)]
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
    from drivetrain.contract.registry import get_plugin_registry

    if get_plugin_registry().info(plugin).kind == "backend" and plugin != backend:
        names = ", ".join("--" + dest for dest in values)
        raise UsageError(
            f"{names}: option(s) of backend {plugin!r}, but the backend is {backend!r}; "
            f"add --backend {plugin}"
        )


# -- the processes' environment and command line -------------------------------------------------------------
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
