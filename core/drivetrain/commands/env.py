"""``drivetrain env``: what to paste in a bug report — versions, plugins, the config in effect, hardware."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from shutil import which
from typing import Any

from drivetrain.commands.parsing import add_option
from drivetrain.contract.registry import get_plugin_registry

HELP = "Show versions, plugins, the config file in effect and the hardware (paste it in bug reports)."


def register_parser(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--config_file", metavar="PATH", help="config file to show (default: the user's)")
    add_option(parser, "--json", action="store_true", help="print JSON")


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 2)
    except (ValueError, OSError, AttributeError):
        return None


def accelerate_provider() -> dict[str, Any]:
    """Which package answers ``import accelerate`` in this environment, found without importing it:
    ``drivetrain`` (through drivetrain-accelerate, docs/hf-stack.md), ``HuggingFace Accelerate`` or none;
    and whether the real Accelerate's files are installed beside drivetrain-accelerate without being used."""
    import importlib.metadata
    import importlib.util

    import drivetrain

    real = [
        dist.version
        for dist in importlib.metadata.MetadataPathFinder.find_distributions(
            importlib.metadata.DistributionFinder.Context(name="accelerate")
        )
        if dist.read_text("RECORD") is not None  # a wheel's dist-info; drivetrain-accelerate's is an egg-info
    ]
    found: dict[str, Any] = {"served_by": None, "version": None, "origin": None, "unused_accelerate": None}
    try:
        spec = importlib.util.find_spec("accelerate")
    except (ImportError, ValueError):
        spec = None
    state = getattr(spec, "loader_state", None)
    if sys.modules.get("accelerate") is drivetrain or (isinstance(state, dict) and "served_by" in state):
        try:
            version = importlib.metadata.version("drivetrain-accelerate")
        except importlib.metadata.PackageNotFoundError:
            version = None
        found.update(served_by="drivetrain", version=version, origin="drivetrain-accelerate")
        found["unused_accelerate"] = real[0] if real else None
    elif spec is not None:
        found.update(
            served_by="HuggingFace Accelerate", version=real[0] if real else None, origin=spec.origin
        )
    return found


def _accelerate_line(found: dict[str, Any]) -> str:
    if found["served_by"] is None:
        return "not installed"
    if found["served_by"] == "drivetrain":
        line = f"served by drivetrain (drivetrain-accelerate {found['version']})"
        if found["unused_accelerate"]:
            line += f"; HuggingFace Accelerate {found['unused_accelerate']} is installed too and never runs"
        return line
    return f"HuggingFace Accelerate {found['version']} ({found['origin']}), not drivetrain"


def collect(config_file: str | None) -> dict[str, Any]:
    import numpy
    import torch

    from drivetrain import __version__
    from drivetrain.commands.plugins import plugin_records
    from drivetrain.config.file import default_config_path, load_config

    config = load_config(config_file, plugins=get_plugin_registry().config_declarations)
    cuda = torch.cuda.is_available()
    report: dict[str, Any] = {
        "drivetrain": __version__,
        "platform": platform.platform(),
        "bash_location": which("drivetrain") or "Not found",
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "cuda_available": cuda,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [],
        "accelerate": accelerate_provider(),
        "config_file": str(config.path) if config.path else None,
        "config_file_searched": str(config_file or default_config_path()),
        "config_format": config.format if config.path else None,
        "config": config.values,
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("DRIVETRAIN_")},
        "plugins": [
            {
                key: entry.get(key)
                for key in (
                    "name",
                    "distribution",
                    "version",
                    "kind",
                    "available",
                    "problem",
                    "optional_requires",
                )
            }
            for entry in plugin_records()
        ],
    }
    return report


def run(args: argparse.Namespace) -> int:
    show(collect(args.config_file), args.json)
    return 0


def show(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return
    lines = [
        "Copy-and-paste the text below in your issue.",
        "",
        f"- drivetrain version: {report['drivetrain']}",
        f"- Platform: {report['platform']}",
        f"- `drivetrain` bash location: {report['bash_location']}",
        f"- Python version: {report['python']}",
        f"- Numpy version: {report['numpy']}",
        f"- PyTorch version (CUDA?): {report['torch']} ({report['cuda_available']})",
        f"- CPU count: {report['cpu_count']}",
        f"- System RAM: {report['memory_gib']} GiB",
        f"- `import accelerate`: {_accelerate_line(report['accelerate'])}",
    ]
    for index, name in enumerate(report["cuda_devices"]):
        lines.append(f"- CUDA device {index}: {name}")
    lines.append("- Plugins:")
    for entry in report["plugins"]:
        state = "ok" if entry["available"] else f"unavailable ({entry['problem']})"
        lines.append(
            f"\t- {entry['name']} ({entry['distribution']} {entry['version']}, {entry['kind']}): {state}"
        )
        for library, optional in (entry.get("optional_requires") or {}).items():
            lines.append(f"\t\t- {library} ({optional['enables']}): {optional['problem'] or 'installed'}")
    if report["config_file"]:
        lines.append(f"- Config file: {report['config_file']} ({report['config_format']} format)")
        for key, value in report["config"].items():
            lines.append(f"\t- {key}: {value}")
    else:
        lines.append(f"- Config file: none (looked for {report['config_file_searched']})")
    if report["environment"]:
        lines.append("- DRIVETRAIN_* environment:")
        lines += [f"\t- {key}={value}" for key, value in report["environment"].items()]
    print("\n".join(lines))


# Accelerate's ``accelerate.commands.env`` entry points.
def env_command(args: argparse.Namespace) -> dict[str, Any]:
    """Print the report, and return its main lines under Accelerate's keys (scripts that call Accelerate's
    ``env_command`` read them, e.g. whether the console command is on PATH)."""
    report = collect(args.config_file)
    show(report, args.json)
    return {
        "`Accelerate` version": report["drivetrain"],
        "Platform": report["platform"],
        "`accelerate` bash location": report["bash_location"],
        "Python version": report["python"],
        "Numpy version": report["numpy"],
        "PyTorch version": report["torch"],
        "PyTorch accelerator": "CUDA" if report["cuda_available"] else "N/A",
        "System RAM": f"{report['memory_gib']} GB",
    }


def __getattr__(attribute: str) -> Any:
    from drivetrain.commands._entry import command_main, command_parser

    parser_for = command_parser("env", register_parser, run, HELP)
    if attribute == "env_command_parser":
        return parser_for
    if attribute == "main":
        return command_main(parser_for, run)
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
