"""The backends a source tree provides: every ``drivetrain.plugins`` entry point in ``plugins/*`` and
``contrib/*`` pyproject files whose module declares ``kind="backend"`` (plus the kernel's ``local``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import tomllib

from drivetrain.plugin_api import PluginError
from drivetrain.plugin_api.tooling import check_requirements, get_plugin_registry


def repository_backends(
    root: str | Path,
    folders: tuple[str, ...] = ("plugins", "contrib"),
    unavailable: dict[str, str] | None = None,
) -> list[str]:
    """Backend plugin names declared under ``root``'s ``folders`` that can run here, ``local`` first.

    A declared backend that is not installed, does not load, or whose library does not import (DeepSpeed
    without its CUDA toolchain, say) is left out with a warning, and recorded in ``unavailable``.
    """
    manager = get_plugin_registry()
    names = ["local"]
    skipped = {} if unavailable is None else unavailable
    for folder in folders:
        for pyproject in sorted(Path(root, folder).glob("*/pyproject.toml")):
            project = tomllib.loads(pyproject.read_text())["project"]
            for name in project.get("entry-points", {}).get("drivetrain.plugins", {}):
                if name not in manager.discovered():
                    skipped[name] = f"not installed (pip install -e {pyproject.parent})"
                    continue
                try:
                    info = manager.info(name)
                except PluginError as exc:
                    skipped[name] = str(exc)
                    continue
                if info.kind != "backend":
                    continue
                problem = check_requirements(info)
                if problem is not None:
                    skipped[name] = problem
                    continue
                names.append(name)
    for name, why in skipped.items():
        warnings.warn(
            f"conformance: backend {name!r} is not checked here: {why}", RuntimeWarning, stacklevel=2
        )
    return names
