"""``drivetrain plugins``: every discovered plugin, what it implements, and whether it can run here."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from drivetrain.commands.parsing import UsageError, add_option

HELP = "List installed plugins: distribution, kind, hooks, and whether their libraries import."


def register_parser(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser,
        "--all",
        action="store_true",
        help="also show each plugin's description, capabilities and registered extensions",
    )
    add_option(parser, "--hook", metavar="NAME", help="only plugins that implement this hook")
    add_option(parser, "--json", action="store_true", help="print JSON instead of a table")


def plugin_records(hook: str | None = None, detailed: bool = False) -> list[dict[str, Any]]:
    """One record per discovered plugin; a plugin that fails to load is listed with the reason."""
    from drivetrain.contract.manager import (
        HOOK_SPECS,
        check_requirements,
        get_plugin_manager,
        missing_library,
    )
    from drivetrain.errors import PluginError

    if hook is not None and hook not in HOOK_SPECS:
        raise UsageError(f"--hook: unknown hook {hook!r}; hooks: {', '.join(sorted(HOOK_SPECS))}")
    manager = get_plugin_manager()
    records = []
    for name in manager.names():
        record = manager.discovered()[name]
        entry: dict[str, Any] = {
            "name": name,
            "distribution": record.distribution,
            "version": record.version,
            "module": record.value,
        }
        try:
            manager.load(name)
        except PluginError as exc:
            entry.update(kind=None, hooks=[], available=False, broken=True, problem=str(exc))
            if hook is None:
                records.append(entry)
            continue
        info = manager.info(name)
        problem = check_requirements(info)
        entry.update(
            kind=info.kind,
            hooks=manager.hooks_of(name),
            requires=list(info.requires),
            optional_requires={
                library: {"enables": enables, "problem": missing_library(library)}
                for library, enables in info.optional_requires.items()
            },
            available=problem is None,
            broken=False,
            problem=problem,
        )
        if detailed:
            extensions = manager.extensions
            entry.update(
                description=info.description,
                contract=info.contract,
                # every declared field (docs/plugins/capabilities.md), tuples as JSON lists
                capabilities={
                    field.name: _plain(getattr(info.capabilities, field.name))
                    for field in dataclasses.fields(info.capabilities)
                },
                commands=sorted(k for k, v in extensions.commands.items() if v[0] == name),
                trackers=sorted(k for k, v in extensions.trackers.items() if v[0] == name),
                launchers=sorted(k for k, v in extensions.launchers.items() if v[0] == name),
                launch_options=any(owner == name for owner, _ in extensions.launch_options),
            )
        if hook is None or hook in entry["hooks"]:
            records.append(entry)
    return records


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def format_table(records: list[dict[str, Any]], detailed: bool) -> str:
    if not records:
        return "no plugins found"
    lines = []
    for entry in records:
        if entry["available"]:
            status = "ok"
        else:
            status = f"{'BROKEN' if entry.get('broken') else 'UNAVAILABLE'}: {entry['problem']}"
        version = f" {entry['version']}" if entry["version"] else ""
        lines.append(f"{entry['name']}  ({entry['distribution']}{version}, {entry['kind'] or '?'})  {status}")
        lines.append(f"    hooks: {', '.join(entry['hooks']) or '-'}")
        if entry.get("requires"):
            lines.append(f"    requires: {', '.join(entry['requires'])}")
        for library, optional in entry.get("optional_requires", {}).items():
            status = optional["problem"] or "installed"
            lines.append(f"    optional: {library} ({optional['enables']}): {status}")
        if detailed and entry["kind"] is not None:
            if entry["description"]:
                lines.append(f"    {entry['description']}")
            caps = ", ".join(f"{name}={_shown(value)}" for name, value in entry["capabilities"].items())
            lines.append(f"    capabilities: {caps}; contract {entry['contract']}")
            for label in ("commands", "trackers", "launchers"):
                if entry[label]:
                    lines.append(f"    {label}: {', '.join(entry[label])}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    records = plugin_records(args.hook, detailed=args.all)
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        print(format_table(records, detailed=args.all))
    return 0
