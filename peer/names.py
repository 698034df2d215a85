"""The reference's public names, module by module: written into peer/reference_names.json (checked in) from the
pinned sdist, read by tests/compat/test_compat_names.py and scripts/compat_coverage.py.

    python -m peer.names --snapshot   # rewrite peer/reference_names.json from the cached (or downloaded) sdist
    python -m peer.names --table      # rewrite docs/compat-coverage.md (drivetrain's side, this environment)

A module's public names are what a script can import from it and the reference defines or re-exports on
purpose: its top-level functions, classes and assignments (also inside top-level ``if``/``try`` blocks, where
the reference defines names conditionally), and, for a package's ``__init__``, the names it imports from its
own submodules. Names with a leading underscore are private. ``test_utils`` is not part of the API (the peer
suite brings the reference's own), and neither is ``commands.menu`` (the terminal widgets behind
``accelerate config``'s questions).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from peer import source  # noqa: E402

SNAPSHOT = Path(__file__).resolve().parent / "reference_names.json"
#: Names drivetrain does not provide yet, each with why: ``"module:name" = "reason"``.
KNOWN_GAPS = Path(__file__).resolve().parent / "name_gaps.toml"
TABLE = REPOSITORY / "docs" / "compat-coverage.md"
#: Every option of the reference's commands: command -> list of spellings per option (peer/reference_cli.py).
CLI_SNAPSHOT = Path(__file__).resolve().parent / "reference_cli.json"
NOT_API = ("test_utils", "commands.menu")


def _top_level(body: list[ast.stmt], is_package: bool, names: set[str]) -> None:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(element, ast.Name):
                        names.add(element.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and is_package and node.level:
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.If):
            _top_level(node.body, is_package, names)
            _top_level(node.orelse, is_package, names)
        elif isinstance(node, ast.Try):
            _top_level(node.body, is_package, names)
            for handler in node.handlers:
                _top_level(handler.body, is_package, names)


def public_names(package_root: Path) -> dict[str, list[str]]:
    """``{module path: sorted public names}`` for every module of the package rooted at ``package_root``."""
    result = {}
    for path in sorted(package_root.rglob("*.py")):
        parts = path.relative_to(package_root.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        if any(f".{excluded}" in f"{module}." for excluded in NOT_API):
            continue
        names: set[str] = set()
        _top_level(ast.parse(path.read_text(encoding="utf-8")).body, is_package, names)
        result[module] = sorted(name for name in names if not name.startswith("_"))
    return result


def reference_names() -> dict[str, list[str]]:
    """The checked-in snapshot: Accelerate module path -> public names."""
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))["modules"]


def known_gaps() -> dict[str, str]:
    """``"accelerate.module:name"`` -> why drivetrain lacks it (peer/name_gaps.toml)."""
    import tomllib

    return tomllib.loads(KNOWN_GAPS.read_text(encoding="utf-8")).get("gaps", {})


def our_module(reference_module: str) -> str:
    return "drivetrain" + reference_module[len(source.REFERENCE) :]


def classify(reference_module: str, name: str) -> tuple[str, str]:
    """``(status, detail)`` of one reference name on drivetrain's side, in this environment:

    - ``implemented``: importable and real (the kernel's, or an installed plugin's);
    - ``plugin``: owned by a plugin that is not installed here: importable, and using it raises an ImportError
      naming the distribution (detail);
    - ``missing``: not importable (detail: the error).
    """
    import importlib

    from drivetrain.compat import install_hints, paths
    from drivetrain.contract import reexport

    try:
        module = importlib.import_module(our_module(reference_module))
    except Exception as error:
        return "missing", f"module does not import: {type(error).__name__}: {error}"
    try:
        value = getattr(module, name)
    except Exception as error:
        return "missing", f"{type(error).__name__}: {error}"
    if isinstance(value, reexport._MissingPluginName):
        return "plugin", value.distribution
    owned = paths.PLUGIN_NAMES_BY_PATH.get(reference_module, {}).get(
        name
    ) or install_hints.PLUGIN_EXPORTS.get(name)
    return "implemented", f"plugin {owned}" if owned and getattr(value, "__module__", "").startswith(
        "drivetrain_"
    ) else ""


def coverage() -> dict[str, dict[str, tuple[str, str]]]:
    return {
        module: {name: classify(module, name) for name in found}
        for module, found in reference_names().items()
    }


def write_table() -> None:
    results = coverage()
    gaps = known_gaps()
    totals = {"implemented": 0, "plugin": 0, "missing": 0}
    lines = [
        "# Accelerate API coverage",
        "",
        "<!-- Generated by `python -m peer.names --table` (peer/names.py) from peer/reference_names.json; "
        "edit those, not this page. -->",
        "",
        f"Every public name of the reference's modules ({source.REFERENCE}=={source.VERSION}; what counts as public: "
        "peer/names.py) against drivetrain's module of the same path (`accelerate.utils.modeling` -> "
        "`drivetrain.utils.modeling`), with every in-tree plugin installed. **implemented**: importable and real "
        "(the kernel's or a plugin's). **plugin**: belongs to a plugin that is not installed (or not written yet): "
        "importable, and using it raises an ImportError naming the distribution. **missing**: not importable yet; "
        "each is listed in `peer/name_gaps.toml` with its reason, and `tests/compat/test_compat_names.py` fails on any "
        "other.",
        "",
        "| module | names | implemented | plugin | missing |",
        "|---|---|---|---|---|",
    ]
    from drivetrain.compat.distributions import UNPUBLISHED_DISTRIBUTIONS

    details = []
    for module, found in results.items():
        counts = {status: sum(1 for s, _ in found.values() if s == status) for status in totals}
        for status, count in counts.items():
            totals[status] += count
        lines.append(
            f"| `{our_module(module)}` | {len(found)} | {counts['implemented']} | {counts['plugin']} | {counts['missing']} |"
        )
        for name, (status, detail) in found.items():
            if status == "plugin":
                install = (
                    f"not published yet ({UNPUBLISHED_DISTRIBUTIONS[detail]}, `{detail}`)"
                    if detail in UNPUBLISHED_DISTRIBUTIONS
                    else f"`pip install {detail}`"
                )
                details.append(f"| `{our_module(module)}.{name}` | plugin | {install} |")
            elif status == "missing":
                reason = gaps.get(f"{module}:{name}", detail)
                details.append(f"| `{our_module(module)}.{name}` | missing | {reason} |")
    lines.append(
        f"| **all** | {sum(totals.values())} | {totals['implemented']} | {totals['plugin']} | {totals['missing']} |"
    )
    lines += ["", "## Names not implemented by the kernel or an installed plugin", "", "| name | status | why |",
              "|---|---|---|", *details, ""]  # fmt: skip
    TABLE.write_text("\n".join(lines), encoding="utf-8")
    print(f"{TABLE}: {totals}")


def write_snapshot() -> None:
    from peer.run import default_cache

    root = source.extracted(default_cache()) / "src" / source.REFERENCE
    names = public_names(root)
    snapshot = {"reference": f"{source.REFERENCE}=={source.VERSION}", "modules": names}
    SNAPSHOT.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{SNAPSHOT}: {sum(map(len, names.values()))} names in {len(names)} modules")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", action="store_true", help="rewrite peer/reference_names.json")
    parser.add_argument("--table", action="store_true", help="rewrite docs/compat-coverage.md")
    parser.add_argument(
        "--cli-snapshot",
        metavar="PYTHON",
        help="rewrite peer/reference_cli.json with the reference's interpreter",
    )
    args = parser.parse_args()
    if args.snapshot:
        write_snapshot()
    if args.table:
        write_table()
    if args.cli_snapshot:
        import subprocess

        script = Path(__file__).resolve().parent / "reference_cli.py"
        subprocess.run([args.cli_snapshot, str(script), str(CLI_SNAPSHOT)], check=True)
    if not (args.snapshot or args.table or args.cli_snapshot):
        parser.print_help()


if __name__ == "__main__":
    main()
