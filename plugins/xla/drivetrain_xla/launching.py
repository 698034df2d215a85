"""``drivetrain launch --tpu`` and ``drivetrain tpu-config``: Accelerate's TPU flags and config keys.

- ``--tpu`` (the kernel's flag, declared by this backend's ``launch_flag``) selects backend ``xla``.
- On one machine the launcher runs the script through torch_xla's own launcher (``torch_xla.launch``: one
  process per device on a TPU VM, one process on the CPU device). With ``--main_training_function NAME`` the
  script is imported and ``NAME()`` is called in each process, as Accelerate's TPU launcher does; without
  it the script runs as ``__main__``.
- ``--tpu_use_cluster`` runs the same ``drivetrain launch`` on every worker of a TPU pod over
  ``gcloud compute tpus tpu-vm ssh --worker all`` (``--tpu_use_sudo`` prefixes ``sudo``; ``--vm`` names the
  workers when not all; ``--env`` variables are exported there).
- ``--downcast_bf16`` with ``mixed_precision: bf16`` sets ``XLA_DOWNCAST_BF16=1`` (float32 computed as bf16,
  float64 as float32); bf16 without it sets ``XLA_USE_BF16=1`` — torch_xla 2.9 still honours both, with a
  deprecation warning.
- ``drivetrain tpu-config`` runs setup commands on every worker of a pod (``--command``, ``--command_file``,
  ``--install_drivetrain``); ``--debug`` prints the gcloud command instead of running it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from typing import Any

from drivetrain.plugin_api import ConfigurationError, UsageError
from drivetrain.plugin_api.settings import plugin_options, to_bool
from drivetrain.plugin_api.tooling import get_plugin_registry

PLUGIN = "xla"

#: Config-file keys this plugin owns (Accelerate's names) -> their checks.
STRING_KEYS = ("main_training_function", "tpu_name", "tpu_zone", "command_file")
BOOL_KEYS = ("downcast_bf16", "tpu_use_cluster", "tpu_use_sudo")
LIST_KEYS = ("tpu_env", "commands", "vm")
#: backend_config keys that only the launcher reads (the backend's own are XlaConfig's fields).
LAUNCH_KEYS = (*STRING_KEYS, *BOOL_KEYS, *LIST_KEYS, "xla_spmd", "xla_fsdp")


# Accelerate writes main_training_function: main, downcast_bf16: 'no', tpu_env: [], tpu_use_cluster: false and
# tpu_use_sudo: false into every config file, whatever its distributed_type; those values state no choice
# (the checks return None), so that an FSDP or DDP config file does not hand options to the xla backend.


def _check_string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value.strip()


def _check_function(value: Any) -> str | None:
    name = _check_string(value)
    return None if name == "main" else name


def _check_bool(value: Any) -> bool | None:
    try:
        return to_bool(value) or None
    except ConfigurationError:
        raise ValueError("expected true or false") from None


def _check_list(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return list(value) or None
    raise ValueError("expected a string or a list of strings")


def config_keys() -> dict[str, Any]:
    checks: dict[str, Any] = {key: _check_string for key in STRING_KEYS}
    checks["main_training_function"] = _check_function
    checks.update({key: _check_bool for key in BOOL_KEYS})
    checks.update({key: _check_list for key in LIST_KEYS if key != "vm"})
    return checks


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--main_training_function",
        default=None,
        metavar="NAME",
        help="with --tpu: import the script and call NAME() in every XLA process (Accelerate's TPU launch)",
    )
    parser.add_argument(
        "--downcast_bf16",
        action="store_true",
        default=None,
        help="with bf16 on XLA: float32 tensors computed as bf16, float64 as float32 (XLA_DOWNCAST_BF16)",
    )
    parser.add_argument(
        "--tpu_use_cluster", action="store_true", default=None, help="launch on every worker of a TPU pod"
    )
    parser.add_argument(
        "--tpu_use_sudo", action="store_true", default=None, help="run the pod workers' commands with sudo"
    )
    parser.add_argument(
        "--vm",
        action="append",
        default=None,
        metavar="WORKER",
        help="with --tpu_use_cluster: a pod worker to launch on (repeatable; default: all)",
    )
    parser.add_argument(
        "--xla_spmd",
        action="store_true",
        default=None,
        help="one process drives every XLA device of the machine (GSPMD data parallelism; XlaConfig(spmd=True))",
    )
    parser.add_argument(
        "--xla_fsdp",
        action="store_true",
        default=None,
        help="SPMD with parameters sharded over the devices (XlaConfig(fsdp=True))",
    )


def register(registry: Any) -> None:
    registry.add_launch_options(add_launch_options)
    registry.add_config_keys(config_keys())
    registry.add_launcher(PLUGIN, launch)
    registry.add_command(
        "tpu-config", register_tpu_config, run_tpu_config, help="run commands on every TPU pod worker"
    )


# -- launching ---------------------------------------------------------------------------------------------------
def _option(args: Any, options: dict[str, Any], name: str, default: Any = None) -> Any:
    value = getattr(args, name, None)
    return value if value is not None else options.get(name, default)


def precision_environment(mixed_precision: str | None, downcast_bf16: bool) -> dict[str, str]:
    """XLA's bf16 variables for ``mixed_precision`` (Accelerate sets them in its TPU launcher)."""
    if mixed_precision != "bf16":
        return {}
    return {"XLA_DOWNCAST_BF16": "1"} if downcast_bf16 else {"XLA_USE_BF16": "1"}


def pod_command(args: Any, options: dict[str, Any], script_argv: list[str]) -> list[str]:
    """The gcloud command that runs this launch on every worker of the TPU pod."""
    name = _option(args, options, "tpu_name")
    zone = _option(args, options, "tpu_zone")
    if not name or not zone:
        raise UsageError(
            "--tpu_use_cluster needs the pod's name and zone: set tpu_name and tpu_zone in the config file "
            "(drivetrain config) "
        )
    env = {}
    for item in [*(getattr(args, "env", None) or []), *options.get("tpu_env", [])]:
        key, _, value = item.partition("=")
        env[key] = value
    exports = [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    relaunch = ["drivetrain", "launch", "--tpu"]
    main_function = _option(args, options, "main_training_function")
    if main_function:
        relaunch += ["--main_training_function", main_function]
    if _option(args, options, "downcast_bf16"):
        relaunch.append("--downcast_bf16")
    mixed_precision = getattr(args, "mixed_precision", None)
    if mixed_precision:
        relaunch += ["--mixed_precision", mixed_precision]
    remote = " ".join(shlex.quote(part) for part in [*relaunch, *script_argv])
    if _option(args, options, "tpu_use_sudo"):
        remote = f"sudo -E {remote}"
    workers = _option(args, options, "vm")
    command = "; ".join([f"cd {shlex.quote(os.getcwd())}", *exports, remote])
    return [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        name,
        f"--zone={zone}",
        f"--worker={','.join(workers) if workers else 'all'}",
        f"--command={command}",
    ]


def file_options(config_file: str | None = None) -> dict[str, Any]:
    """This plugin's launch options and config-file keys (``config_file`` instead of the one
    ``DRIVETRAIN_CONFIG_FILE`` names, when given), checked."""
    get_plugin_registry().load(PLUGIN)  # its config keys are claimed when it is loaded
    if config_file is None:
        return plugin_options(PLUGIN)
    previous = os.environ.get("DRIVETRAIN_CONFIG_FILE")
    os.environ["DRIVETRAIN_CONFIG_FILE"] = config_file
    try:
        return plugin_options(PLUGIN)
    finally:
        if previous is None:
            os.environ.pop("DRIVETRAIN_CONFIG_FILE", None)
        else:
            os.environ["DRIVETRAIN_CONFIG_FILE"] = previous


def launch(args: Any, script_argv: list[str]) -> int:
    """The launcher of backend ``xla`` (``registry.add_launcher``)."""
    options = file_options()
    mixed_precision = getattr(args, "mixed_precision", None) or os.environ.get("DRIVETRAIN_MIXED_PRECISION")
    os.environ.update(
        precision_environment(mixed_precision, bool(_option(args, options, "downcast_bf16", False)))
    )
    if _option(args, options, "tpu_use_cluster", False):
        command = pod_command(args, options, script_argv)
        print("drivetrain launch: " + shlex.join(command), file=sys.stderr, flush=True)
        if shutil.which("gcloud") is None:
            raise UsageError("--tpu_use_cluster runs gcloud, which is not installed here (Google Cloud SDK)")
        return subprocess.call(command)
    if getattr(args, "num_processes", None) not in (None, 1):
        print(
            "drivetrain launch: --num_processes is ignored with --tpu: torch_xla starts one process per XLA "
            "device of this machine",
            file=sys.stderr,
        )
    command = [sys.executable, "-m", "drivetrain_xla.run_script"]
    main_function = _option(args, options, "main_training_function")
    if main_function:
        command += ["--main_training_function", main_function]
    print(f"drivetrain launch: backend xla, torch_xla's launcher, {shlex.join(script_argv)}", file=sys.stderr)
    return subprocess.call([*command, "--", *script_argv])


# -- drivetrain tpu-config ---------------------------------------------------------------------------------------
def register_tpu_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config_file", default=None, help="config file with tpu_name, tpu_zone, commands")
    parser.add_argument("--tpu_name", default=None, help="the TPU pod's name (config key tpu_name)")
    parser.add_argument("--tpu_zone", default=None, help="its zone (config key tpu_zone)")
    parser.add_argument("--use_alpha", action="store_true", help="use `gcloud alpha` instead of `gcloud`")
    parser.add_argument(
        "--command", action="append", default=None, help="a command to run on every worker (repeatable)"
    )
    parser.add_argument("--command_file", default=None, help="a file with one command per line")
    # Accelerate's spellings (--install_accelerate, --accelerate_version) are accepted for scripts written for it
    parser.add_argument(
        "--install_drivetrain",
        "--install_accelerate",
        dest="install_drivetrain",
        action="store_true",
        help="pip install drivetrain drivetrain-xla first",
    )
    parser.add_argument(
        "--drivetrain_version",
        "--accelerate_version",
        dest="drivetrain_version",
        default="latest",
        help="the version to install (or 'dev')",
    )
    parser.add_argument("--debug", action="store_true", help="print the gcloud command instead of running it")


def tpu_config_command(args: argparse.Namespace) -> list[str]:
    """The gcloud command ``drivetrain tpu-config`` runs (UsageError naming what is missing)."""
    options = file_options(args.config_file)
    name = args.tpu_name or options.get("tpu_name")
    zone = args.tpu_zone or options.get("tpu_zone")
    if not name or not zone:
        raise UsageError(
            "tpu-config needs --tpu_name and --tpu_zone (or tpu_name / tpu_zone in the config file)"
        )
    commands = list(args.command or [])
    command_file = args.command_file or options.get("command_file")
    if command_file:
        try:
            with open(command_file, encoding="utf-8") as handle:
                commands += [line.strip() for line in handle if line.strip()]
        except OSError as exc:
            raise UsageError(f"--command_file {command_file}: {exc.strerror}") from None
    if not commands:
        commands = list(options.get("commands", []))
    if args.install_drivetrain:
        package = {"latest": "drivetrain drivetrain-xla", "dev": "drivetrain drivetrain-xla --pre"}.get(
            args.drivetrain_version, f"drivetrain=={args.drivetrain_version} drivetrain-xla"
        )
        commands.insert(0, f"pip install -U {package}")
    if not commands:
        raise UsageError(
            "tpu-config has nothing to run: pass --command, --command_file or --install_drivetrain "
            "(or set commands / command_file in the config file)"
        )
    gcloud = ["gcloud", "alpha"] if args.use_alpha else ["gcloud"]
    remote = "; ".join(["cd /usr/share", *commands])
    # Accelerate's argument order, so that --debug prints what its users (and its tests) expect
    return [
        *gcloud,
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        name,
        "--zone",
        zone,
        "--command",
        remote,
        "--worker",
        "all",
    ]


def run_tpu_config(args: argparse.Namespace) -> int:
    command = tpu_config_command(args)
    if args.debug:
        # joined with spaces, not shell-quoted: the line Accelerate's --debug prints
        print(f"Running {' '.join(command)}")
        return 0
    if shutil.which(command[0]) is None:
        raise UsageError("tpu-config runs gcloud, which is not installed here (Google Cloud SDK)")
    return subprocess.call(command)


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``accelerate.commands.tpu.tpu_command_parser``: the ``tpu-config`` options, as a parser
    of its own or added to ``subparsers``; the parsed namespace runs with :func:`tpu_command_launcher`."""
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", help="run commands on every TPU pod worker")
    else:
        parser = argparse.ArgumentParser(
            "drivetrain tpu-config", description="run commands on every TPU pod worker"
        )
    register_tpu_config(parser)
    if subparsers is not None:
        parser.set_defaults(func=tpu_command_launcher)
    return parser


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Accelerate's ``tpu_command_launcher``: runs (or with ``--debug`` prints) the gcloud command."""
    returncode = run_tpu_config(args)
    if returncode:
        raise SystemExit(returncode)
