"""Run with drivetrain's interpreter (no peer overlay): reads {"names": [[module, name], ...], "paths": [dotted,
...]} as JSON on stdin and prints, for each, whether it resolves on drivetrain and, when it does not, where
else in the `drivetrain` package a public name of that spelling lives."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import pkgutil
import sys
import warnings


def _import(module: str):
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module), ""
    except Exception as error:
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def resolve_name(module: str, name: str) -> tuple[bool, str]:
    loaded, error = _import(module)
    if loaded is None:
        return False, f"module {module} does not import ({error})"
    if name == "*":
        return True, ""
    try:
        getattr(loaded, name)
        return True, ""
    except AttributeError:
        pass
    except Exception as error:
        return False, f"{module}.{name} fails to load ({type(error).__name__}: {error})"
    if hasattr(loaded, "__path__"):
        sub, _ = _import(f"{module}.{name}")
        if sub is not None:
            return True, ""
    return False, f"{module} has no {name}"


def resolve_path(path: str) -> tuple[bool, str]:
    """A dotted path as mock.patch or logging would take it: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        loaded, _ = _import(".".join(parts[:cut]))
        if loaded is None:
            continue
        target = loaded
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False, f"{'.'.join(parts[:cut])} imports, no attribute path {'.'.join(parts[cut:])}"
            target = getattr(target, attribute)
        return True, ""
    return False, "no prefix imports"


def index_public_names() -> dict[str, list[str]]:
    """name -> drivetrain modules that offer it (every importable module of the package)."""
    import drivetrain

    found: dict[str, list[str]] = {}
    modules = ["drivetrain"] + [
        info.name
        for info in pkgutil.walk_packages(drivetrain.__path__, "drivetrain.")
        if ".test_utils" not in info.name
    ]
    for module in modules:
        loaded, _ = _import(module)
        if loaded is None:
            continue
        names = set(getattr(loaded, "__all__", ())) | {n for n in vars(loaded) if not n.startswith("_")}
        for name in names:
            found.setdefault(name, []).append(module)
    return found


def main() -> None:
    request = json.load(sys.stdin)
    index = index_public_names()
    names = []
    for module, name in request["names"]:
        ok, why = resolve_name(module, name)
        names.append(
            {"module": module, "name": name, "ok": ok, "why": why, "elsewhere": index.get(name, [])[:4]}
        )
    paths = []
    for path in request["paths"]:
        ok, why = resolve_path(path)
        paths.append({"path": path, "ok": ok, "why": why})
    json.dump({"names": names, "paths": paths}, sys.stdout)


if __name__ == "__main__":
    main()
