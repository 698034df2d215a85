"""The machinery behind Accelerate's module paths (``drivetrain.utils.modeling``, ``drivetrain.tracking``, ...):
each such module is a thin table of where its names live in drivetrain, resolved on first use, so importing one
loads that module and nothing else until a name is asked for.

A name that belongs to a backend plugin resolves through the plugin's ``drivetrain.exports`` entry point; when
the plugin is not installed it is still importable (``from drivetrain.utils import DeepSpeedPlugin`` works) and
using it (calling it, reading an attribute) raises an ImportError naming the distribution to install.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import CodeType, ModuleType
from typing import Any

from drivetrain.compat import distributions, install_hints, paths
from drivetrain.compat.placeholders import _MissingPluginName, missing_plugin_name  # noqa: F401


def plugin_name(name: str, distribution: str | None, module: str) -> Any:
    """``name`` from the installed plugin exporting it, else its placeholder (naming the distribution to install,
    or saying that the installed one does not provide the name)."""
    import importlib.metadata as importlib_metadata

    from drivetrain.contract.info import EXPORTS_GROUP

    for entry_point in importlib_metadata.entry_points(group=EXPORTS_GROUP):
        if entry_point.name == name:
            return entry_point.load()
    hinted = distribution or install_hints.PLUGIN_EXPORTS.get(name)
    if hinted is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    try:
        installed = importlib_metadata.version(hinted)
    except importlib_metadata.PackageNotFoundError:
        return missing_plugin_name(name, hinted, module, distributions.UNPUBLISHED_DISTRIBUTIONS.get(hinted))
    placeholder = missing_plugin_name(name, hinted, module)
    placeholder.missing_message = (
        f"{name} ({accelerate_path(module)}) is not provided by the installed {hinted} {installed}"
    )
    return placeholder


#: The namespaces where every plugin-provided public name resolves (``from drivetrain import LocalSGD``).
_PLUGIN_NAMESPACES = ("drivetrain", "drivetrain.utils")

#: Table value for a module's ``logger`` (Accelerate's modules each have one): drivetrain's logger of that name.
LOGGER = paths.LOGGER


def accelerate_path(module_name: str) -> str:
    """``drivetrain.utils.modeling`` -> ``accelerate.utils.modeling``."""
    return "accelerate" + module_name[len("drivetrain") :]


def reexport(
    module_name: str, table: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for the module ``module_name``.

    ``table`` maps a name to ``"module"`` (same name there) or ``"module:attribute"``. Names for this Accelerate
    path that spell a backend (``is_<backend>_available``, ``<BACKEND>_MODEL_NAME``) and the names plugins own
    are listed in :mod:`drivetrain.compat.paths` and merged in here.
    """
    accelerate_module = accelerate_path(module_name)
    full = {**table, **paths.KERNEL_NAMES_BY_PATH.get(accelerate_module, {})}
    owned = paths.PLUGIN_NAMES_BY_PATH.get(accelerate_module, {})
    public = sorted(
        name for name in {*full, *owned} if not name.startswith("_")
    )  # private names resolve, unlisted

    def __getattr__(name: str) -> Any:
        target = full.get(name)
        if target == LOGGER:
            # drivetrain.logging sits above the contract layer: looked up by name, when first asked for
            value = importlib.import_module("drivetrain.logging").get_logger(module_name)
        elif target is not None:
            module_path, _, attribute = target.partition(":")
            value = getattr(importlib.import_module(module_path), attribute or name)
        elif name in owned:
            value = plugin_name(name, owned[name], module_name)
        elif name in install_hints.PLUGIN_EXPORTS and module_name in _PLUGIN_NAMESPACES:
            value = plugin_name(name, install_hints.PLUGIN_EXPORTS[name], module_name)
        else:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:
        return public

    return __getattr__, __dir__, public


class _GeneratedModuleLoader(importlib.abc.Loader):
    """Makes the module of one of Accelerate's paths (or of drivetrain's own, :data:`compat.paths.OWN_MODULES`)
    from its table in :data:`compat.paths.GENERATED_MODULES`: no file, only the table (``__getattr__`` resolves a
    name on first use, as :func:`reexport` does)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return ModuleType(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        table = paths.GENERATED_MODULES[name]
        resolve, listing, public = reexport(name, table)
        submodules = sorted(
            child.rpartition(".")[2] for child in paths.GENERATED_MODULES if child.rpartition(".")[0] == name
        )

        def __getattr__(attribute: str) -> Any:
            # ``drivetrain.utils.modeling`` reached as an attribute, as in Accelerate; a name of the table that is
            # also a submodule's (``drivetrain.utils.tqdm``, the function) is the name, as Accelerate's package
            # imports it over the submodule
            if attribute in submodules and attribute not in public:
                return importlib.import_module(f"{name}.{attribute}")
            return resolve(attribute)

        whose = (
            f"drivetrain's own ``{name}``"
            if name in paths.OWN_MODULES
            else f"Accelerate's ``{accelerate_path(name)}``"
        )
        module.__doc__ = (
            f"{whose}, generated from its table in drivetrain.compat.paths: "
            "each name resolves to where it lives in drivetrain (the kernel or the plugin providing it)."
        )
        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__dir__ = listing  # type: ignore[method-assign]
        module.__all__ = public  # type: ignore[attr-defined]
        for child in submodules:
            if child in public:
                # importing the submodule later would bind the package's attribute to it: import it now and
                # unbind it, so the name stays the table's (Accelerate's package imports its names over them)
                importlib.import_module(f"{name}.{child}")
                delattr(module, child)
        on_import = paths.ON_IMPORT.get(name)
        if on_import is not None:  # a path whose import does something in Accelerate (a warning, a handler)
            importlib.import_module(on_import)

    def get_code(self, fullname: str) -> CodeType | None:
        """What ``python -m <path>`` runs, for the paths in :data:`compat.paths.RUN_AS_MAIN` (runpy asks the
        loader; importing the path never runs it): the function named there, its result the exit status."""
        target = paths.RUN_AS_MAIN.get(fullname)
        if target is None:
            return None  # runpy then says there is no code to run
        module_name, _, function = target.partition(":")
        source = f"import importlib, sys\nsys.exit(importlib.import_module({module_name!r}).{function}())\n"
        return compile(source, f"<{fullname}: {target}>", "exec")


class GeneratedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the paths in :data:`compat.paths.GENERATED_MODULES` (and nothing else)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in paths.GENERATED_MODULES:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _GeneratedModuleLoader(), origin="generated")
        if any(child.startswith(fullname + ".") for child in paths.GENERATED_MODULES):
            spec.submodule_search_locations = []  # a package: its generated submodules import too
        return spec


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import drivetrain`` does)."""
    if not any(isinstance(finder, GeneratedModuleFinder) for finder in sys.meta_path):
        # before the file system's finder: a folder left where one of these paths used to be a package (a stale
        # __pycache__ after an upgrade) would otherwise be imported as an empty namespace package. After any
        # finder put ahead of it on purpose (a test harness serving its own drivetrain.test_utils).
        position = next(
            (index for index, finder in enumerate(sys.meta_path) if finder is importlib.machinery.PathFinder),
            len(sys.meta_path),
        )
        sys.meta_path.insert(position, GeneratedModuleFinder())
