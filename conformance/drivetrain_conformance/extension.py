"""``drivetrain conformance NAME [--processes N]``, registered through the register_extensions hook."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from drivetrain import hookimpl
from drivetrain.plugin_api import PluginInfo

PLUGIN_INFO = PluginInfo(kind="extension", description="the conformance suite: `drivetrain conformance NAME`")
HELP = "Check that a backend keeps the plugin contract: one verdict per property."


def register_parser(parser: argparse.ArgumentParser) -> None:
    from drivetrain_conformance.properties import DEFAULT_TIMEOUT

    parser.add_argument(
        "backends",
        nargs="+",
        metavar="NAME",
        help="installed backend plugin name(s), or a .py file defining a plugin module",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="run the multi-process properties with N processes (gloo on CPU; default 1)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="time limit of each property (default %(default)g s): one that runs longer is reported as a "
        "hang, naming the hook and the collective each process waits in, and the suite goes on",
    )
    parser.add_argument(
        "--plugins",
        default="",
        metavar="NAME[,NAME]",
        help="plugins every checked Accelerator names (Accelerator(plugins=[...])): a device or feature "
        "plugin checked over the backend(s), against the reference backend alone",
    )
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument(
        "--nd",
        action="store_true",
        help="also check the N-D layout properties (ParallelismConfig) on the dimensions each backend declares",
    )


def _print_as_it_comes(processes: int) -> Any:
    """Each verdict on stderr as soon as it is known, one line (stdout keeps the report, with the stacks of a
    hang, or the JSON)."""
    from drivetrain_conformance.targets import target_name

    def show(target: str, verdict: Any, seconds: float | None) -> None:
        took = f" ({seconds:.1f} s)" if seconds is not None else ""
        reason = f": {verdict.reason}" if verdict.status != "pass" and verdict.reason else ""
        print(
            f"[{target_name(target)}, {processes}p] {verdict.status} {verdict.property}{took}{reason}",
            file=sys.stderr,
            flush=True,
        )

    return show


def run(args: argparse.Namespace) -> int:
    from drivetrain.plugin_api import UsageError
    from drivetrain_conformance.runner import run_suite

    if args.processes < 1:
        raise UsageError(f"conformance: --processes must be 1 or more, got {args.processes}")
    timeout = args.timeout
    if timeout <= 0:
        raise UsageError(f"conformance: --timeout must be more than 0 seconds, got {args.timeout:g}")
    from drivetrain.plugin_api import PluginError
    from drivetrain.plugin_api.tooling import get_plugin_registry
    from drivetrain_conformance.properties import unusable_plugin
    from drivetrain_conformance.targets import is_file_target

    manager = get_plugin_registry()
    plugins = tuple(name.strip() for name in args.plugins.split(",") if name.strip())
    for name in (*args.backends, *plugins):
        if not is_file_target(name) and name not in manager.discovered():
            try:
                manager.load(name)
            except PluginError as exc:
                raise UsageError(f"conformance: {exc}") from None
    for name in plugins:
        problem = unusable_plugin(name, manager.info(name))
        if problem is not None:
            raise UsageError(f"conformance: --plugins: {problem}")
    reports = run_suite(
        list(args.backends),
        processes=args.processes,
        timeout=timeout,
        plugins=plugins,
        on_verdict=_print_as_it_comes(args.processes),
    )
    if getattr(args, "nd", False):
        from drivetrain_conformance.nd_suite import ND_PROPERTIES, run_nd_suite

        for name in list(args.backends):
            if not is_file_target(name):
                info = manager.info(name)
                # one launch for every layout: the limit of one property for each of them
                nd_timeout = timeout * len(ND_PROPERTIES)
                reports[f"{name} (N-D)"] = run_nd_suite(name, info, args.processes, nd_timeout)
    if args.json:
        print(json.dumps([report.to_json() for report in reports.values()], indent=2))
    else:
        print("\n\n".join(report.format() for report in reports.values()))
    return 0 if all(report.ok for report in reports.values()) else 1


def register_new_plugin_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the backend's name, as users pass it to --backend")
    parser.add_argument("--description", default=None, help="one line saying what the backend does")
    parser.add_argument("--author", default=None, help="the author named in pyproject.toml")
    parser.add_argument(
        "--output-dir", default=".", metavar="DIR", help="where drivetrain-NAME/ is created (default: here)"
    )
    parser.add_argument(
        "--template",
        default=None,
        metavar="DIR",
        help="the plugin template (default: contrib/plugin-template)",
    )


def run_new_plugin(args: argparse.Namespace) -> int:
    from pathlib import Path

    from drivetrain.plugin_api import UsageError
    from drivetrain_conformance.scaffold import DEFAULT_TEMPLATE, render

    overrides = {key: getattr(args, key) for key in ("description", "author") if getattr(args, key)}
    template = Path(args.template) if args.template else DEFAULT_TEMPLATE
    try:
        project = render(args.name, Path(args.output_dir), template, **overrides)
    except ValueError as exc:
        raise UsageError(f"new-plugin: {exc}") from None
    print(f"created {project}")
    print(f"next: pip install -e {project} && drivetrain conformance {args.name} --processes 2")
    return 0


@hookimpl
def register_extensions(registry) -> None:
    registry.add_command("conformance", register_parser, run, HELP)
    registry.add_command(
        "new-plugin",
        register_new_plugin_parser,
        run_new_plugin,
        "Create a backend plugin package from the template.",
    )
