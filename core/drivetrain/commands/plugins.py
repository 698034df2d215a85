"""``drivetrain plugins``: every discovered plugin, what it implements, and whether it can run here."""

from __future__ import annotations

import argparse
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
    """One record per discovered plugin; a plugin that fails to load is listed with the reason. Plugins
    installed through entry points are imported in a child process (plugin_probe.py), so that one that
    hangs or ends its process is listed as broken rather than taking the listing with it."""
    from drivetrain.commands.plugin_probe import plugin_record, probe_records
    from drivetrain.contract.registry import HOOK_SPECS, get_plugin_registry

    if hook is not None and hook not in HOOK_SPECS:
        raise UsageError(f"--hook: unknown hook {hook!r}; hooks: {', '.join(sorted(HOOK_SPECS))}")
    manager = get_plugin_registry()
    discovered = manager.discovered()
    installed = [name for name in manager.names() if discovered[name].entry_point is not None]
    probed = probe_records(installed, detailed) if installed else {}
    records = []
    for name in manager.names():
        # plugins registered in code are in this process already: nothing left to import
        entry = probed[name] if name in probed else plugin_record(manager, name, detailed)
        if hook is None or hook in entry["hooks"]:  # a broken plugin has no hooks: listed without --hook
            records.append(entry)
    return records


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
