"""Copied as `sitecustomize.py` into the drivetrain side's work folder and put on PYTHONPATH, so that every
process of a peer run (pytest, the launcher's workers, debug/notebook launcher children) sees it.

It does one thing always: `drivetrain.test_utils` (and its submodules) is the reference's own test_utils
package, renamed, from the work folder: the regression models and datasets, the `require_*` decorators, the
launch helpers and the multi-process scripts are the reference's, never ours. Its
`path_in_accelerate_package("test_utils", ...)` points there too (the reference looks inside its installed
package, where drivetrain has no test_utils).

With PEER_DEFER_MISSING=1 (`peer/run.py --diagnose`, never a counted run) it also defers every missing
`drivetrain` module or name to its first use: importing it gives a placeholder that raises
`PeerMissingName` when used. That lets a test file that dies at import still run, to see which of its tests
fail for another reason.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

PACKAGE = "drivetrain"
TEST_UTILS = Path(__file__).resolve().parent.parent / "test_utils"


class PeerMissingName(ImportError):
    """A name or module the reference has and drivetrain does not (diagnostic runs only)."""


class _TestUtilsFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        prefix = f"{PACKAGE}.test_utils"
        if fullname != prefix and not fullname.startswith(prefix + "."):
            return None
        relative = fullname[len(prefix) :].lstrip(".").split(".") if fullname != prefix else []
        base = TEST_UTILS.joinpath(*relative)
        if base.is_dir():
            return importlib.util.spec_from_file_location(
                fullname, base / "__init__.py", submodule_search_locations=[str(base)]
            )
        if base.with_suffix(".py").is_file():
            spec = importlib.util.spec_from_file_location(fullname, base.with_suffix(".py"))
            if fullname == f"{prefix}.testing" and spec is not None:
                spec.loader = _TestingLoader(spec.loader)
            return spec
        return None


class _TestingLoader(importlib.abc.Loader):
    """Loads test_utils/testing.py, then points its ``path_in_accelerate_package("test_utils", ...)`` at this
    work folder's test_utils: the reference finds its scripts inside its installed package, and here that
    package's test_utils is the reference's, served from the work folder (see the finder above)."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        in_package = module.path_in_accelerate_package

        def path_in_accelerate_package(*components):
            if components and components[0] == "test_utils":
                return TEST_UTILS.joinpath(*components[1:])
            return in_package(*components)

        module.path_in_accelerate_package = path_in_accelerate_package


class Missing:
    """Stands for a name drivetrain lacks; any use raises PeerMissingName naming it."""

    def __init__(self, qualname: str):
        object.__setattr__(self, "_peer_qualname", qualname)

    def _fail(self, *args, **kwargs):
        raise PeerMissingName(f"drivetrain lacks {object.__getattribute__(self, '_peer_qualname')}")

    def __call__(self, *args, **kwargs):
        if object.__getattribute__(self, "_peer_qualname").rsplit(".", 1)[-1].startswith("is_"):
            # `is_*_available()` and friends gate whole modules (test_utils picks the device with them at
            # import): a missing predicate answers False so what it guards can still be seen.
            return False
        return self._fail()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Missing(f"{object.__getattribute__(self, '_peer_qualname')}.{name}")

    def __mro_entries__(self, bases):
        # `class MyTracker(GeneralTracker)` with GeneralTracker missing: the class can be defined, using it fails.
        qualname = object.__getattribute__(self, "_peer_qualname")

        class _MissingBase:
            def __init__(self, *args, **kwargs):
                raise PeerMissingName(f"drivetrain lacks {qualname}")

        return (_MissingBase,)

    __iter__ = __len__ = __getitem__ = __enter__ = _fail
    __eq__ = __lt__ = __gt__ = __add__ = __or__ = _fail
    __hash__ = object.__hash__

    def __repr__(self):
        return f"<missing {object.__getattribute__(self, '_peer_qualname')}>"


def _defer_attributes(module: types.ModuleType) -> None:
    original = module.__dict__.get("__getattr__")

    def __getattr__(name):
        if original is not None:
            try:
                return original(name)
            except (
                AttributeError,
                ImportError,
            ):  # ImportError: a name a plugin that is not installed provides
                pass
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        # `from package import submodule` asks the package first: a real submodule not imported yet is loaded.
        path = module.__dict__.get("__path__")
        if path and importlib.machinery.PathFinder.find_spec(f"{module.__name__}.{name}", path) is not None:
            return importlib.import_module(f"{module.__name__}.{name}")
        return Missing(f"{module.__name__}.{name}")

    module.__getattr__ = __getattr__


class _DeferringLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # get_source, get_resource_reader... for tracebacks and resources
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _defer_attributes(module)
        # The reference has packages where drivetrain has a module (`commands.config.config_args`): let the
        # import system look for submodules here, so the missing ones become placeholders too.
        if not hasattr(module, "__path__"):
            module.__path__ = []


class _MissingModuleLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__peer_missing__ = True
        _defer_attributes(module)


class _DeferringFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _TestUtilsFinder):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _DeferringLoader(spec.loader)
                return spec
        if fullname == PACKAGE:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MissingModuleLoader(), is_package=True)


sys.meta_path.insert(0, _TestUtilsFinder())
if os.environ.get("PEER_DEFER_MISSING") == "1":
    sys.meta_path.insert(1, _DeferringFinder())
