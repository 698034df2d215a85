"""Move a plugin's imports from contract 1.1's flat ``drivetrain.plugin_api`` names to contract 1.2's places.

python scripts/plugin_api_migrate.py PATH...          # rewrite the .py files under each PATH in place
python scripts/plugin_api_migrate.py --check PATH...  # list what would change; exit 1 when something would

``from drivetrain.plugin_api import PluginInfo, safe_load`` becomes
``from drivetrain.plugin_api import PluginInfo`` and ``from drivetrain.plugin_api.checkpoint import safe_load``
(the table is ``drivetrain.plugin_api._moved.moved()``; see docs/plugins/versioning.md). Only import statements
are rewritten; an attribute read such as ``plugin_api.safe_load(...)`` is listed for you to change. Run
``ruff check --fix`` (or your import sorter) afterwards to order the new lines.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from drivetrain.plugin_api._moved import moved

API = "drivetrain.plugin_api"


def _new_imports(node: ast.ImportFrom, indent: str) -> str:
    """The 1.2 import lines for one 1.1 ``from drivetrain.plugin_api import ...`` statement."""
    by_module: dict[str, list[str]] = {}
    for alias in node.names:
        module = f"{API}.{moved()[alias.name]}" if alias.name in moved() else API
        by_module.setdefault(module, []).append(alias.name + (f" as {alias.asname}" if alias.asname else ""))
    return "".join(
        f"{indent}from {module} import {', '.join(names)}\n" for module, names in sorted(by_module.items())
    )


def migrate(source: str) -> tuple[str, list[str]]:
    """(the rewritten source, notes on what could not be rewritten: line and attribute)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits = []
    notes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == API:
            if any(alias.name in moved() for alias in node.names):
                first = lines[node.lineno - 1]
                indent = first[: len(first) - len(first.lstrip())]
                edits.append((node.lineno, node.end_lineno or node.lineno, _new_imports(node, indent)))
        elif isinstance(node, ast.Attribute) and node.attr in moved():
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("plugin_api", "api"):
                notes.append(
                    f"{node.lineno}: {base.id}.{node.attr} -> {API}.{moved()[node.attr]}.{node.attr}"
                )
    for start, end, text in sorted(edits, reverse=True):
        lines[start - 1 : end] = [text]
    return "".join(lines), notes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument(
        "--check", action="store_true", help="list what would change; exit 1 when something would"
    )
    args = parser.parse_args()
    files = sorted(
        {file for path in args.paths for file in ([path] if path.is_file() else path.rglob("*.py"))}
    )
    pending = 0
    for file in files:
        source = file.read_text(encoding="utf-8")
        migrated, notes = migrate(source)
        for note in notes:
            print(f"{file}:{note} (change by hand)")
        pending += len(notes)
        if migrated != source:
            pending += 1
            if args.check:
                print(f"{file}: imports contract 1.1 flat names")
            else:
                file.write_text(migrated, encoding="utf-8")
                print(f"{file}: imports moved to contract 1.2")
    return 1 if args.check and pending else 0


if __name__ == "__main__":
    sys.exit(main())
