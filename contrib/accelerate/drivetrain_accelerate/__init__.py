"""``import accelerate`` served by drivetrain.

Installing drivetrain-accelerate puts ``drivetrain-accelerate.pth`` in site-packages; Python runs it at start-up
and it calls :func:`install`, which puts :class:`AccelerateFinder` first on ``sys.meta_path``. From then on
``accelerate`` and every ``accelerate.<path>`` import is drivetrain's module of the same path, the same object
(``accelerate.utils is drivetrain.utils``): a name patched on ``accelerate.big_modeling`` is patched on
``drivetrain.big_modeling``. The finder also answers ``importlib.metadata`` for the distribution
``accelerate`` with drivetrain-accelerate's ``accelerate.egg-info`` (its version is the Accelerate API drivetrain
implements), which is what transformers, peft and trl check, and what pip sees as the installed Accelerate.

Because the finder comes before the path-based finders, the real Accelerate never runs here even when pip has
installed its files beside this (peft and trl require ``accelerate``). ``DRIVETRAIN_ACCELERATE=0`` leaves
``import accelerate`` to whatever else is installed, for one process. This module imports nothing but the
standard library at start-up: drivetrain (and torch) are imported when ``accelerate`` is.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

#: the distribution whose files this is, and the import name it serves
DISTRIBUTION = "drivetrain-accelerate"
SERVED = "accelerate"
#: the package whose modules serve it
TARGET = "drivetrain"
#: the metadata folder this distribution installs for the distribution name ``accelerate``
EGG_INFO = "accelerate.egg-info"
#: ``DRIVETRAIN_ACCELERATE=0`` (or false/no/off) turns the finder off for the process
SWITCH = "DRIVETRAIN_ACCELERATE"


def target_name(fullname: str) -> str | None:
    """``accelerate.utils.modeling`` -> ``drivetrain.utils.modeling``; None for a name outside ``accelerate``."""
    if fullname == SERVED or fullname.startswith(SERVED + "."):
        return TARGET + fullname[len(SERVED) :]
    return None


class _AliasLoader:
    """Loads ``accelerate.<path>`` as drivetrain's module ``drivetrain.<path>`` itself (not a copy)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import importlib

        module = importlib.import_module(self.target)
        # importlib writes the alias's spec over the module's own after this returns; exec_module puts it back
        # so that drivetrain's module keeps its identity (reload, pickling by module path, find_spec).
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._own_spec

    # ``python -m accelerate.commands.launch`` (runpy) asks the loader for the code to run as __main__.
    def _target_loader(self) -> Any:
        import importlib.util

        spec = importlib.util.find_spec(self.target)
        if spec is None or spec.loader is None:
            raise ImportError(f"{self.target} (serving {SERVED}) has no loader")
        return spec.loader

    def get_code(self, fullname: str) -> Any:
        return self._target_loader().get_code(self.target)

    def get_source(self, fullname: str) -> Any:
        return self._target_loader().get_source(self.target)

    def is_package(self, fullname: str) -> bool:
        return bool(self._target_loader().is_package(self.target))


class AccelerateFinder:
    """A ``sys.meta_path`` finder for ``accelerate`` and ``accelerate.*``, and the ``importlib.metadata``
    finder for the distribution ``accelerate``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        name = target_name(fullname)
        if name is None:
            return None
        import importlib.util

        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            found = None
        if found is None:  # No module named 'accelerate.<path>' (drivetrain has no such module)
            return None
        spec = ModuleSpec(
            fullname,
            _AliasLoader(name),  # type: ignore[arg-type]
            origin=found.origin,
            loader_state={"served_by": DISTRIBUTION, "target": name},
            is_package=found.submodule_search_locations is not None,
        )
        if found.submodule_search_locations is not None:
            spec.submodule_search_locations = list(found.submodule_search_locations)
        return spec

    def find_distributions(self, context: Any = None) -> Any:
        """``importlib.metadata.version("accelerate")``: this distribution's ``accelerate.egg-info`` answers,
        before any real Accelerate's metadata. Other lookups (pip's scans of a folder) are left to the
        path-based finder, which finds the same folder on disk."""
        name = getattr(context, "name", None)
        if name is None or name.lower().replace("-", "_").replace(".", "_") != SERVED:
            return iter(())
        folder = egg_info_folder()
        if folder is None:
            return iter(())
        import importlib.metadata

        return iter((importlib.metadata.PathDistribution(folder),))

    def invalidate_caches(self) -> None:
        """Nothing cached."""


def egg_info_folder() -> Any:
    """The ``accelerate.egg-info`` folder this distribution installed (beside its own metadata), or None."""
    import importlib.metadata

    try:
        own = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    folder = own.locate_file(EGG_INFO)
    return folder if os.path.isdir(str(folder)) else None


def disabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (the ``.pth`` file calls this at start-up), unless
    ``DRIVETRAIN_ACCELERATE=0``. Idempotent."""
    if disabled():
        return
    if not any(isinstance(finder, AccelerateFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AccelerateFinder())


def uninstall() -> None:
    """Take the finder off ``sys.meta_path`` (modules already imported as ``accelerate`` stay in sys.modules)."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, AccelerateFinder)]
