"""``drivetrain config``: write the launch config file by answering questions (from a terminal or piped),
``config default`` for this machine's basics, ``config update`` to rewrite an old or Accelerate file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from drivetrain.commands.parsing import UsageError, add_option
from drivetrain.config.file import (
    KEYS,
    PRECISIONS,
    RDZV_BACKENDS,
    basic_config,
    default_config_path,
    load_config,
    save_config,
)
from drivetrain.contract.registry import get_plugin_registry

HELP = "Create the config file `drivetrain launch` reads (questions; or `default`, `update`)."


def register_parser(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser, "--config_file", metavar="PATH", help=f"where to write (default: {default_config_path()})"
    )
    sub = parser.add_subparsers(dest="config_command", metavar="{default,update}", title="subcommands")
    default = sub.add_parser(
        "default",
        help="write a basic config for this machine without questions",
        description="Write a basic config for this machine without questions.",
    )
    add_option(default, "--config_file", metavar="PATH", help="where to write")
    add_option(default, "--mixed_precision", choices=PRECISIONS, default="no", help="precision to record")
    add_option(default, "--overwrite", action="store_true", help="replace an existing file")
    update = sub.add_parser(
        "update",
        help="rewrite an existing (or Accelerate) config file in drivetrain's format",
        description="Rewrite an existing config file (also Accelerate's) in drivetrain's format.",
    )
    add_option(update, "--config_file", metavar="PATH", help="the file to update")


class Questions:
    """Asks on stdout, reads answers from stdin line by line; an empty answer takes the default."""

    def __init__(self, read: Callable[[], str] | None = None) -> None:
        self._read = read or sys.stdin.readline
        self.interactive = sys.stdin.isatty()

    def ask(self, question: str, check: Callable[[str], Any], default: Any = None) -> Any:
        hint = f" [{default}]" if default is not None else ""
        while True:
            print(f"{question}{hint}: ", end="", flush=True)
            line = self._read()
            if line == "":
                raise UsageError(f"no answer to {question!r}: input ended (pipe one answer per line)")
            answer = line.strip()
            if not self.interactive:
                print(answer)
            if answer == "" and default is not None:
                answer = str(default)
            try:
                return check(answer)
            except ValueError as exc:
                print(f"  invalid answer {answer!r}: {exc}; try again")


def _key(name: str) -> Callable[[str], Any]:
    return KEYS[name]


def questionnaire(questions: Questions) -> dict[str, Any]:
    import torch

    from drivetrain.contract.registry import get_plugin_registry

    manager = get_plugin_registry()
    backends = []
    for name in manager.names():
        try:
            if manager.info(name).kind == "backend":
                backends.append(name)
        except Exception:
            continue

    def backend(answer: str) -> str | None:
        if answer in ("", "auto", "automatic"):
            return None
        if answer not in backends:
            raise ValueError(f"choose one of: automatic, {', '.join(backends)}")
        return answer

    values: dict[str, Any] = {}
    chosen = questions.ask(
        f"Distribution backend ({', '.join(['automatic', *backends])})", backend, "automatic"
    )
    if chosen:
        values["backend"] = chosen
    machines = questions.ask("How many machines", _key("num_machines"), 1)
    if machines > 1:
        values["num_machines"] = machines
        values["machine_rank"] = questions.ask(
            "Rank of this machine (0 on the main one)", _key("machine_rank"), 0
        )
        values["main_process_ip"] = questions.ask(
            "IP address of the machine of rank 0", _key("main_process_ip")
        )
        values["main_process_port"] = questions.ask(
            "Port on the machine of rank 0", _key("main_process_port"), 29500
        )
        rdzv = questions.ask(
            f"Rendezvous backend ({'/'.join(RDZV_BACKENDS)})", _key("rdzv_backend"), "static"
        )
        if rdzv != "static":
            values["rdzv_backend"] = rdzv
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if questions.ask("Compute on the CPU only (yes/no)", _key("use_cpu"), "no" if gpus else "yes"):
        values["use_cpu"] = True
        gpus = 0
    values["num_processes"] = questions.ask(
        "How many processes in total (all machines)", _key("num_processes"), max(gpus, 1) * machines
    )
    precision = questions.ask(f"Mixed precision ({'/'.join(PRECISIONS)})", _key("mixed_precision"), "no")
    if precision != "no":
        values["mixed_precision"] = precision
    dynamo = questions.ask("torch.compile backend (NO, INDUCTOR, EAGER, ...)", _key("dynamo_backend"), "NO")
    if dynamo != "NO":
        values["dynamo_backend"] = dynamo
    if questions.ask("Debug mode: check collectives' shapes across processes (yes/no)", _key("debug"), "no"):
        values["debug"] = True
    return values


def run(args: argparse.Namespace) -> int:
    command = getattr(args, "config_command", None)
    if command == "default":
        target = args.config_file or default_config_path()
        from pathlib import Path

        if Path(target).exists() and not args.overwrite:
            raise UsageError(
                f"config file {target} already exists; pass --overwrite to replace it, or run "
                "`drivetrain config update`"
            )
        path = save_config(basic_config(args.mixed_precision), target)
        print(f"drivetrain config saved at {path}")
        return 0
    if command == "update":
        declarations = get_plugin_registry().config_declarations()
        config = load_config(args.config_file, required=True, plugins=declarations)
        path = save_config(config.values, config.path, declarations)
        note = " (converted from Accelerate's format)" if config.format == "accelerate" else ""
        print(f"drivetrain config updated at {path}{note}")
        return 0
    values = questionnaire(Questions())
    path = save_config(values, args.config_file)
    print(f"drivetrain config saved at {path}")
    return 0
