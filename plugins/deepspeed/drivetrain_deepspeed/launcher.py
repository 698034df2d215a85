"""``drivetrain launch --backend deepspeed``: the DeepSpeed options, and DeepSpeed's multi-node launcher.

Without a hostfile, torch's elastic launcher starts the processes (one machine, or several with
``--num_machines``/``--main_process_ip`` as for any backend). With ``--deepspeed_hostfile`` (or
``deepspeed_hostfile`` in the config file's deepspeed section) DeepSpeed's runner starts them on the hosts it
lists, through ``--deepspeed_multinode_launcher`` (pdsh, openmpi, mvapich, slurm, ...). The DRIVETRAIN_*
settings reach remote processes through DeepSpeed's environment file (``DS_ENV_FILE``).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from typing import Any

from drivetrain.plugin_api import ConfigurationError, free_port
from drivetrain.plugin_api.settings import backend_settings, to_bool

#: ``--deepspeed_multinode_launcher`` values: DeepSpeed runner's launchers, plus Accelerate's "standard" (torch's
#: launcher, hostfile unused) and "nossh" (DeepSpeed's runner on each machine, started by the user).
MULTINODE_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "impi", "slurm", "nossh")
#: Variables the processes need besides DRIVETRAIN_* (DeepSpeed exports PYTHON* itself).
_FORWARDED = ("OMP_NUM_THREADS", "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR", "CUDA_VISIBLE_DEVICES")


def add_launch_options(parser: Any) -> None:
    def option(name: str, help: str, **kwargs: Any) -> None:
        parser.add_argument(f"--{name}", default=None, help=help, **kwargs)

    option(
        "zero_stage",
        "ZeRO stage: 0 off, 1 optimizer states, 2 + gradients, 3 + parameters",
        type=int,
        choices=(0, 1, 2, 3),
    )
    option(
        "offload_optimizer_device",
        "offload optimizer states: none, cpu or nvme",
        choices=("none", "cpu", "nvme"),
    )
    option(
        "offload_param_device",
        "offload parameters (ZeRO-3): none, cpu or nvme",
        choices=("none", "cpu", "nvme"),
    )
    option("offload_optimizer_nvme_path", "folder for optimizer states offloaded to NVMe", metavar="DIR")
    option("offload_param_nvme_path", "folder for parameters offloaded to NVMe", metavar="DIR")
    option("gradient_clipping", "clip gradients by this global norm", type=float)
    option(
        "zero3_init_flag", "create models already partitioned with deepspeed.zero.Init (ZeRO-3)", type=_bool
    )
    option("zero3_save_16bit_model", "save_model gathers 16-bit weights under ZeRO-3", type=_bool)
    option("deepspeed_config_file", "DeepSpeed JSON config file", metavar="PATH")
    option("deepspeed_moe_layer_cls_names", "comma-separated Mixture-of-Experts layer class names")
    option(
        "deepspeed_hostfile",
        "hostfile for DeepSpeed's multi-node launcher (lines `host slots=N`)",
        metavar="PATH",
    )
    option(
        "deepspeed_multinode_launcher",
        "DeepSpeed multi-node launcher: pdsh (default), openmpi, mvapich, mpich, impi, slurm, nossh (one "
        "runner per machine, no ssh), or standard (torch's launcher on every machine)",
        choices=MULTINODE_LAUNCHERS,
    )
    option("deepspeed_inclusion_filter", "DeepSpeed --include filter (e.g. `host1@host2:0,2`)")
    option("deepspeed_exclusion_filter", "DeepSpeed --exclude filter")


def _bool(text: str) -> bool:
    try:
        return to_bool(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _setting(args: Any, name: str) -> Any:
    value = getattr(args, name, None)
    if value is not None:
        return value
    return backend_settings("deepspeed")[1].get(name)


def _only_this_machine(hostfile: str) -> bool:
    local = {"localhost", "127.0.0.1", socket.gethostname()}
    with open(hostfile, encoding="utf-8") as handle:
        hosts = {line.split()[0] for line in handle if line.strip() and not line.lstrip().startswith("#")}
    return bool(hosts) and hosts <= local


def runner_command(args: Any, script_argv: list[str], env_file: str) -> list[str]:
    """The ``deepspeed.launcher.runner`` command line for this launch."""
    command = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--hostfile",
        str(_setting(args, "deepspeed_hostfile")),
        "--no_local_rank",
    ]
    local = _only_this_machine(str(_setting(args, "deepspeed_hostfile")))
    launcher = _setting(args, "deepspeed_multinode_launcher")
    if launcher == "nossh":
        # The user starts the runner on every machine; each starts its own processes (DeepSpeed >= 0.14.5).
        command += ["--no_ssh", "--node_rank", str(getattr(args, "machine_rank", None) or 0)]
    else:
        if local:
            # DeepSpeed asks the first host over ssh (reachable? its address?) even when it starts all here.
            command.append("--no_ssh_check")
        if launcher:
            command += ["--launcher", str(launcher)]
    include, exclude = (
        _setting(args, "deepspeed_inclusion_filter"),
        _setting(args, "deepspeed_exclusion_filter"),
    )
    if include and exclude:
        raise LaunchOptionError(
            f"--deepspeed_inclusion_filter {include!r} and --deepspeed_exclusion_filter {exclude!r}: DeepSpeed takes "
            "one of them; give only one"
        )
    if include:
        command += ["--include", str(include)]
    if exclude:
        command += ["--exclude", str(exclude)]
    address = getattr(args, "main_process_ip", None) or ("127.0.0.1" if local else None)
    port = getattr(args, "main_process_port", None) or (free_port() if local else None)
    if address:
        command += ["--master_addr", str(address)]
    if port:
        command += ["--master_port", str(port)]
    if getattr(args, "module", False):
        command.append("--module")
    if getattr(args, "no_python", False):
        command.append("--no_python")
    return [*command, *script_argv]


class LaunchOptionError(ValueError):
    """Launch options that cannot go together (reported as one line by launch_with_deepspeed)."""


def launch_with_deepspeed(args: Any, script_argv: list[str]) -> int | None:
    """Start the job with DeepSpeed's runner when a hostfile is given; otherwise ``None`` (torch's launcher,
    also for ``--deepspeed_multinode_launcher standard``)."""
    if (
        not _setting(args, "deepspeed_hostfile")
        or _setting(args, "deepspeed_multinode_launcher") == "standard"
    ):
        return None
    hostfile = str(_setting(args, "deepspeed_hostfile"))
    if not os.path.isfile(hostfile):
        print(f"drivetrain launch: error: --deepspeed_hostfile {hostfile} does not exist", file=sys.stderr)
        return 2
    launcher = _setting(args, "deepspeed_multinode_launcher")
    if launcher is not None and launcher not in MULTINODE_LAUNCHERS:
        print(
            f"drivetrain launch: error: deepspeed_multinode_launcher {launcher!r} is not one of "
            f"{', '.join(MULTINODE_LAUNCHERS)}",
            file=sys.stderr,
        )
        return 2
    try:
        runner_command(args, script_argv, "")
    except LaunchOptionError as exc:
        print(f"drivetrain launch: error: {exc}", file=sys.stderr)
        return 2
    exported = {
        name: value
        for name, value in os.environ.items()
        if name.startswith("DRIVETRAIN_") or name in _FORWARDED
    }
    with tempfile.NamedTemporaryFile("w", suffix=".deepspeed_env", delete=False) as handle:
        for name, value in sorted(exported.items()):
            if "\n" not in value:
                handle.write(f"{name}={value}\n")
        env_file = handle.name
    try:
        env = {**os.environ, "DS_ENV_FILE": env_file}
        return subprocess.run(runner_command(args, script_argv, env_file), env=env, check=False).returncode
    finally:
        os.unlink(env_file)
