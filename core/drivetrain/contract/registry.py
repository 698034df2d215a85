"""Plugin discovery, validation and loading.

Discovery reads entry-point metadata only (group ``drivetrain.plugins``); a plugin module is imported the
first time something needs it, and a backend's third-party library only when that backend runs (listing
plugins asks ``importlib.util.find_spec`` whether a library is installed, without importing it).
"""

from __future__ import annotations

import difflib
import importlib.metadata as importlib_metadata
import importlib.util
import inspect
import os
import re
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pluggy

from drivetrain.compat.install_hints import ACCELERATE_DISTRIBUTED_TYPES
from drivetrain.config import parallelism, sources
from drivetrain.contract import hookspecs
from drivetrain.contract.attribution import attribute
from drivetrain.contract.calling import PluginStack
from drivetrain.contract.import_watch import watch_import
from drivetrain.contract.info import (
    DEVICE_ENTRY_POINT_GROUP,
    ENTRY_POINT_GROUP,
    REFERENCE_BACKEND,
    REMOVED_FIELDS,
    DiscoveredPlugin,
    ExtensionRegistry,
    PluginHooks,
    PluginInfo,
)
from drivetrain.errors import PluginError

if TYPE_CHECKING:
    from drivetrain.config.file import PluginDeclarations


def _hook_specs() -> dict[str, list[str]]:
    """Hook name -> argument names, read from hookspecs.py."""
    return {
        name: list(inspect.signature(getattr(hookspecs, name)).parameters) for name in hookspecs.HOOK_STYLES
    }


HOOK_SPECS: dict[str, list[str]] = _hook_specs()
#: hookimpl options that would reorder calls; composition order is decided by plugin kind alone.
_ORDERING_OPTIONS = ("tryfirst", "trylast", "wrapper", "hookwrapper")


def hook_implementations(plugin: Any) -> dict[str, Any]:
    """The functions of ``plugin`` marked with ``@hookimpl``, by name."""
    marker = f"{hookspecs.PROJECT_NAME}_impl"
    found = {}
    for name in dir(plugin):
        try:
            value = getattr(plugin, name)
        except Exception:
            continue
        if callable(value) and hasattr(value, marker):
            found[name] = value
    return found


def validate_plugin(name: str, plugin: Any) -> None:
    """Reject a plugin whose hooks do not match the spec, naming the plugin, the hook and the argument."""
    info = getattr(plugin, "PLUGIN_INFO", None)
    if info is not None:
        if not isinstance(info, PluginInfo):
            raise PluginError(f"plugin {name!r}: PLUGIN_INFO must be a drivetrain.plugin_api.PluginInfo")
        wanted_major = info.contract.split(".")[0]
        have_major = hookspecs.CONTRACT_VERSION.split(".")[0]
        if wanted_major != have_major:
            raise PluginError(
                f"plugin {name!r} implements contract {info.contract}, but this drivetrain implements "
                f"contract {hookspecs.CONTRACT_VERSION}; install a version of the plugin built for "
                f"contract {have_major}.x or a drivetrain that provides contract {info.contract}"
            )
    marker = f"{hookspecs.PROJECT_NAME}_impl"
    for hook_name, function in hook_implementations(plugin).items():
        if hook_name not in HOOK_SPECS:
            close = difflib.get_close_matches(hook_name, HOOK_SPECS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginError(
                f"plugin {name!r} implements unknown hook {hook_name!r}{hint} "
                f"(known hooks: {', '.join(sorted(HOOK_SPECS))})"
            )
        options = getattr(function, marker) or {}
        ordering = [option for option in _ORDERING_OPTIONS if options.get(option)]
        if ordering:
            raise PluginError(
                f"plugin {name!r}, hook {hook_name!r}: hookimpl({ordering[0]}=True) is not supported; the "
                "order of plugins follows their kind (device, precision, feature, backend)"
            )
        allowed = HOOK_SPECS[hook_name]
        for argument in inspect.signature(function).parameters:
            if argument in ("self",):
                continue
            if argument not in allowed:
                close = difflib.get_close_matches(argument, allowed, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise PluginError(
                    f"plugin {name!r}, hook {hook_name!r}: unknown argument {argument!r}{hint} "
                    f"(the hook's arguments are: {', '.join(allowed)})"
                )


def _allowed_names() -> set[str] | None:
    """``DRIVETRAIN_LOAD_PLUGINS=a,b`` restricts loading to those plugins (``local`` is always kept)."""
    raw = os.environ.get("DRIVETRAIN_LOAD_PLUGINS")
    if raw is None:
        return None
    names = {part.strip() for part in raw.split(",") if part.strip()}
    names.add(REFERENCE_BACKEND)
    return names


def import_failure(record: DiscoveredPlugin, exc: BaseException) -> str:
    """One line naming the plugin, its distribution and what went wrong, with the fix where it is known."""
    detail = str(exc) if isinstance(exc, PluginImportTimeout) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SystemExit):
        detail = f"it called sys.exit({exc.code!r}) while importing"
    elif not str(exc):
        detail = f"{type(exc).__name__} raised while importing"
    removed = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if removed and removed.group(1) in REMOVED_FIELDS:
        detail += (
            f" (PluginInfo field {removed.group(1)!r} was removed in contract 1.1: "
            f"{REMOVED_FIELDS[removed.group(1)]}; see docs/plugins/versioning.md)"
        )
    return (
        f"plugin {record.name!r} (distribution {record.distribution} {record.version}) failed to import "
        f"{record.value}: {detail}"
    )


#: Seconds a plugin module may take to import (``DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT``; 0: no limit).
DEFAULT_IMPORT_TIMEOUT = 120.0


class PluginImportTimeout(Exception):
    """A plugin's import ran past its time limit."""


def import_time_limit() -> float:
    """Seconds a plugin module may take to import (0: no limit)."""
    raw = os.environ.get("DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT", "")
    try:
        return float(raw) if raw.strip() else DEFAULT_IMPORT_TIMEOUT
    except ValueError:
        raise PluginError(
            f"DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT={raw!r} is not a number of seconds (0 turns the limit off)"
        ) from None


def _import_with_time_limit(record: DiscoveredPlugin) -> Any:
    """Import plugin ``record``'s module on a helper thread and wait at most the time limit for it.

    Why a thread: the import is never interrupted, so a slow but healthy import (a plugin importing torch
    on a loaded machine) cannot be left half-initialised, which interrupting it with a signal would do; and
    a subprocess probe would cost a full import of every plugin. A plugin still importing after the limit
    is reported and skipped; its thread is a daemon, left blocked (it holds only the import lock of what it
    was importing) and does not keep the process from exiting. A real Ctrl-C reaches the main thread, which
    only waits, and interrupts the command as usual."""
    seconds = import_time_limit()
    if seconds <= 0:
        return record.entry_point.load()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["module"] = record.entry_point.load()
        except BaseException as exc:  # SystemExit and KeyboardInterrupt raised by the plugin included
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"drivetrain-import-{record.name}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise PluginImportTimeout(
            f"it did not finish importing within {seconds:g} s (DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT)"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["module"]


class PluginRegistry:
    """Discovers plugins from entry points, loads them on demand and validates them. Not pluggy's
    ``PluginManager``: it keeps one of those holding every loaded plugin, and each
    :class:`~drivetrain.contract.calling.PluginStack` keeps its own for the active plugins only.

    One instance per process (:func:`get_plugin_registry`); :func:`reset_plugin_registry` forgets it.
    Plugins can also be registered directly (``register(name, module_or_object)``), which tests and
    notebooks use.
    """

    def __init__(self) -> None:
        self._pluggy = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pluggy.add_hookspecs(hookspecs)
        self._discovered: dict[str, DiscoveredPlugin] | None = None
        self._registered: dict[str, DiscoveredPlugin] = {}
        #: plugin name -> what is registered with pluggy for it (its hook functions)
        self._registered_objects: dict[str, Any] = {}
        self.extensions = ExtensionRegistry()
        self._warned: set[str] = set()

    # -- discovery -----------------------------------------------------------------------------------------
    def discovered(self) -> dict[str, DiscoveredPlugin]:
        """Every plugin known by name: entry points (filtered by DRIVETRAIN_LOAD_PLUGINS) and direct
        registrations. Imports nothing."""
        if self._discovered is None:
            allowed = _allowed_names()
            found: dict[str, DiscoveredPlugin] = {}
            for entry_point in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
                if allowed is not None and entry_point.name not in allowed:
                    continue
                dist = getattr(entry_point, "dist", None)
                found.setdefault(
                    entry_point.name,
                    DiscoveredPlugin(
                        name=entry_point.name,
                        value=entry_point.value,
                        distribution=dist.metadata["Name"] if dist is not None else "?",
                        version=dist.version if dist is not None else "?",
                        entry_point=entry_point,
                    ),
                )
            self._discovered = found
        return {**self._discovered, **self._registered}

    def names(self) -> list[str]:
        return sorted(self.discovered())

    def device_plugins(self) -> list[str]:
        """Device runtime plugins: those listed in the ``drivetrain.devices`` entry-point group, and plugins
        registered in code whose kind is ``device``. Imports only them; one that fails to load is skipped
        with a warning (``drivetrain plugins`` shows why)."""
        discovered = self.discovered()
        listed = {
            entry_point.name
            for entry_point in importlib_metadata.entry_points(group=DEVICE_ENTRY_POINT_GROUP)
        }
        candidates = sorted(name for name in discovered if name in listed or name in self._registered)
        return [name for name, info in self.loadable(candidates) if info.kind == "device"]

    # -- loading ---------------------------------------------------------------------------------------------
    def load(self, name: str) -> DiscoveredPlugin:
        """Import and register plugin ``name`` (once). Raises PluginError naming what is wrong; a plugin
        that failed once keeps failing with the same message (its import is not retried)."""
        plugins = self.discovered()
        if name not in plugins:
            raise PluginError(unknown_plugin_message(name, plugins))
        record = plugins[name]
        if record.loaded:
            return record
        if record.error is not None:
            raise PluginError(record.error)
        try:
            with watch_import(record.name, record.distribution):
                module = _import_with_time_limit(record)
                self._register(record, module)
        except PluginError as exc:
            record.error = str(exc)
            raise
        except BaseException as exc:
            # SystemExit, KeyboardInterrupt and a hang (see _time_limit) included: one plugin must not take
            # down every command; it is named, skipped, and shown as broken by `drivetrain plugins`.
            record.error = import_failure(record, exc)
            raise PluginError(record.error) from exc
        return record

    def load_all(self) -> list[DiscoveredPlugin]:
        return [self.load(name) for name in self.names()]

    def register(
        self, name: str, plugin: Any, distribution: str = "(registered in code)"
    ) -> DiscoveredPlugin:
        """Register a plugin object directly, without an entry point."""
        if name in self.discovered() and self.discovered()[name].loaded:
            raise PluginError(f"a plugin named {name!r} is already registered; pick another name")
        record = DiscoveredPlugin(name=name, value=repr(plugin), distribution=distribution, version="")
        self._register(record, plugin)
        self._registered[name] = record
        return record

    def unregister(self, name: str) -> None:
        record = self._registered.pop(name, None)
        if record is not None and record.module is not None:
            self._pluggy.unregister(name=name)
            self._registered_objects.pop(name, None)
            self.extensions.forget(name)

    def _register(self, record: DiscoveredPlugin, plugin: Any) -> None:
        validate_plugin(record.name, plugin)
        hooks = PluginHooks(record.name, hook_implementations(plugin))
        self._pluggy.register(hooks, name=record.name)
        self._registered_objects[record.name] = hooks
        record.module = plugin
        if "register_extensions" in hook_implementations(plugin):
            others = [obj for key, obj in self._registered_objects.items() if key != record.name]
            caller = self._pluggy.subset_hook_caller("register_extensions", others)
            self.extensions.current_plugin = record.name
            try:
                caller(registry=self.extensions)
            except BaseException as exc:
                attribute(exc, "register_extensions", caller.get_hookimpls())
                raise
            finally:
                self.extensions.current_plugin = ""

    def hook_object(self, name: str) -> Any:
        """The object registered with pluggy for plugin ``name`` (loads it)."""
        self.load(name)
        return self._registered_objects[name]

    def hooks_of(self, name: str) -> list[str]:
        """Hook names that plugin ``name`` implements (loads it)."""
        return sorted(hook_implementations(self.load(name).module))

    def info(self, name: str) -> PluginInfo:
        return self.load(name).info

    def loadable(self, names: Iterable[str] | None = None) -> Iterator[tuple[str, PluginInfo]]:
        """Each plugin's (or each of ``names``') name and info, in name order, importing a plugin module only
        when reached.

        A plugin that fails to load is left out with a warning naming it and why, so that one broken
        extension cannot stop a training run that does not use it; ``drivetrain plugins`` shows the error.
        """
        for name in self.names() if names is None else names:
            try:
                info = self.info(name)
            except PluginError as exc:
                if name not in self._warned:
                    self._warned.add(name)
                    warnings.warn(
                        f"drivetrain: skipping plugin {name!r}: {exc}", RuntimeWarning, stacklevel=3
                    )
                continue
            yield name, info

    def plugins_of_kind(self, kind: str) -> list[str]:
        """Names of plugins of one kind (loads every plugin module, never their libraries); plugins that fail
        to load are left out with a warning."""
        return [name for name, info in self.loadable() if info.kind == kind]

    def find_plugin(self, **declared: Any) -> str | None:
        """The first plugin (by name) whose ``PluginInfo`` has every given field equal to the given value
        (``find_plugin(distributed_type="FSDP")``), or None."""
        return next(
            (
                name
                for name, info in self.loadable()
                if all(getattr(info, field) == value for field, value in declared.items())
            ),
            None,
        )

    def multiprocess_backend(self) -> str | None:
        """The backend used when several processes run and none is named: the first by name of those that
        declare ``select_for_multiprocess``, or None. Plugin modules are imported in name order only until
        it is found (a later one cannot come first), which keeps the launcher's start-up short."""
        return self.find_plugin(kind="backend", select_for_multiprocess=True)

    def config_declarations(self) -> PluginDeclarations:
        """What the installed plugins declare about the config file (imports every plugin module): the
        backends answering Accelerate's ``distributed_type`` values and the top-level keys plugins own."""
        from drivetrain.config.file import PluginDeclarations

        distributed_types = {
            info.distributed_type: (name, info.config_section)
            for name, info in self.loadable()
            if info.kind == "backend" and info.distributed_type
        }
        return PluginDeclarations(
            distributed_types=distributed_types,
            keys=dict(self.extensions.config_keys),
            install_hints=dict(ACCELERATE_DISTRIBUTED_TYPES),
        )

    def backend_for_device(self, device_type: str) -> str | None:
        """The backend that declares ``device_type`` in ``select_for_devices`` (the first by name), or None."""
        return next(
            (
                name
                for name, info in self.loadable()
                if info.kind == "backend" and device_type in info.select_for_devices
            ),
            None,
        )

    def backend_answering(self, distributed_type: str, running: str) -> str | None:
        """The backend in charge of Accelerate's ``distributed_type`` (``"FSDP"``) in a run of backend
        ``running``: ``running`` for the types that name no backend (``MULTI_GPU``, ``MULTI_CPU``...: plain
        processes, whatever runs them) and for the type it declares; otherwise the installed backend declaring
        it, or None (the type belongs to a backend that is not installed)."""
        from drivetrain.config.file import ACCELERATE_AUTOMATIC_TYPES

        if (
            distributed_type in ACCELERATE_AUTOMATIC_TYPES
            or self.info(running).distributed_type == distributed_type
        ):
            return running
        return self.find_plugin(kind="backend", distributed_type=distributed_type)

    def joins(self, distributed_type: str, running: str) -> bool:
        """Whether ``join_uneven_inputs`` runs under torch's ``Join`` for ``distributed_type`` in a run of backend
        ``running``: the backend answering the type (:meth:`backend_answering`) declares
        ``Capabilities.joinable``. A plugin written before contract 1.3 could not declare it and keeps 1.2's rule
        (every multi-process run of plain processes, ``MULTI_*``, joined), so a minor version changes nothing
        for it."""
        backend = self.backend_answering(distributed_type, running)
        if backend is None:
            return False
        info = self.info(backend)
        if info.capabilities.joinable:
            return True
        written_for = tuple(int(part) for part in info.contract.split(".")[:2])
        return (
            written_for < (1, 3) and info.capabilities.multi_process and distributed_type.startswith("MULTI_")
        )

    def sequence_parallel_backends(self) -> list[str]:
        """The ``ParallelismConfig.sp_backend`` values the installed backends declare (``PluginInfo.sp_backend``),
        in plugin name order (imports every plugin module)."""
        return [info.sp_backend for _, info in self.loadable() if info.kind == "backend" and info.sp_backend]

    def backend_for_flag(self, flag: str) -> str | None:
        """The installed backend that declares Accelerate's launch flag ``flag`` (``"use_fsdp"``), or None."""
        return self.find_plugin(kind="backend", launch_flag=flag)

    def plugin_of(self, obj: Any) -> str | None:
        """The plugin whose package defines ``obj``'s class (``FP8RecipeKwargs`` -> ``"fp8"``), judged from
        the entry points' module paths without importing anything; None for the kernel's own classes."""
        package = type(obj).__module__.split(".")[0]
        for name, record in self.discovered().items():
            if record.entry_point is not None and record.value.split(".")[0].split(":")[0] == package:
                return name
        return None

    def distribution_of(self, name: str) -> str:
        """The distribution that provides plugin ``name`` (for install hints)."""
        record = self.discovered().get(name)
        if record is not None and record.distribution not in ("?", "(registered in code)"):
            return record.distribution
        return f"drivetrain-{name}"

    def stack(self, names: Iterable[str]) -> PluginStack:
        """The active plugins for one Accelerator, in composition order, with ``local`` as the fallback."""
        names = list(dict.fromkeys(names))
        for name in [*names, REFERENCE_BACKEND]:
            self.load(name)
        return PluginStack(
            [(name, self.info(name).kind, self._registered_objects[name]) for name in names],
            (REFERENCE_BACKEND, self._registered_objects[REFERENCE_BACKEND]),
        )


def unknown_plugin_message(name: str, plugins: dict[str, DiscoveredPlugin]) -> str:
    installed = ", ".join(sorted(plugins)) or "none"
    restricted = ""
    if _allowed_names() is not None:
        restricted = f" (DRIVETRAIN_LOAD_PLUGINS={os.environ['DRIVETRAIN_LOAD_PLUGINS']} restricts loading)"
    return (
        f"unknown drivetrain plugin {name!r}; installed: {installed}{restricted}. "
        f"Install it with: pip install drivetrain-{name}"
    )


def missing_library(module_name: str) -> str | None:
    """Why ``module_name`` cannot be imported here, judged without importing it; None when it is installed."""
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        return f"{module_name} is not importable: {type(exc).__name__}: {exc}"
    return None if found is not None else f"{module_name} is not installed"


def check_requirements(info: PluginInfo) -> str | None:
    """Why one of the plugin's required libraries is not installed, or None when all are (no import)."""
    return next((problem for problem in map(missing_library, info.requires) if problem), None)


_registry: PluginRegistry | None = None


def get_plugin_registry() -> PluginRegistry:
    """The process's plugin registry (created on first use; discovery reads metadata only)."""
    global _registry
    if _registry is None:
        _registry = PluginRegistry()
    return _registry


#: The class's name before contract 1.2 (it read as pluggy's); kept for code that imports it.
PluginManager = PluginRegistry


def reset_plugin_registry() -> None:
    """Forget every discovered and registered plugin (the next use discovers again)."""
    global _registry
    _registry = None


#: The functions' names before contract 1.3 (they return the registry, not pluggy's manager); kept for code that
#: calls them.
get_plugin_manager = get_plugin_registry
reset_plugin_manager = reset_plugin_registry


def _check_config_file(data: dict[str, Any], origin: str) -> tuple[dict[str, Any], str]:
    from drivetrain.config.file import normalise

    return normalise(data, origin, get_plugin_registry().config_declarations())


# The file named by DRIVETRAIN_CONFIG_FILE is checked against what the installed plugins declare, exactly as
# `drivetrain launch --config_file` checks it; drivetrain.config sits below this layer and cannot ask itself.
sources.use_config_file_check(_check_config_file)
# ParallelismConfig(sp_backend=...) accepts the values the installed backends declare, asked the same way.
parallelism.use_declared_sp_backends(lambda: get_plugin_registry().sequence_parallel_backends())
