"""``import accelerate`` served by drivetrain, for a harness run made before the ``drivetrain-accelerate``
distribution is installed (hfstack/README.md, "Who serves accelerate").

``accelerate`` and every ``accelerate.X`` import as ``drivetrain`` and ``drivetrain.X``: the same module objects,
not copies. The start-up folder holds an ``accelerate-<version>.dist-info`` beside this file, so that
``importlib.metadata.version("accelerate")`` answers drivetrain's version, as the distribution will.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

SERVED, BY = "accelerate", "drivetrain"


class _ServedModule(importlib.abc.Loader):
    def __init__(self, target: str, after_first) -> None:
        self.target, self.after_first = target, after_first

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        if self.after_first is not None:
            self.after_first()
        return module

    def exec_module(self, module) -> None:
        """The module is drivetrain's, already executed."""


class AcceleratePathFinder(importlib.abc.MetaPathFinder):
    def __init__(self, patch_blockers: bool) -> None:
        self.patch_blockers = patch_blockers

    def find_spec(self, fullname, path=None, target=None):
        if fullname != SERVED and not fullname.startswith(SERVED + "."):
            return None
        target_name = BY + fullname[len(SERVED) :]
        if importlib.util.find_spec(target_name) is None:
            return None
        after_first = None
        if self.patch_blockers:
            import hfstack_blockers

            after_first = hfstack_blockers.apply
        return importlib.machinery.ModuleSpec(fullname, _ServedModule(target_name, after_first))


def install(patch_blockers: bool = False) -> None:
    if not any(isinstance(finder, AcceleratePathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AcceleratePathFinder(patch_blockers))
