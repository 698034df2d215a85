"""Plugin discovery, validation, loading, listing and hook calling.

Discovery reads entry-point metadata only (group ``drivetrain.plugins``); a plugin module is imported the
first time something needs it, and a backend's third-party library only when that backend runs.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata as importlib_metadata
import inspect
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import pluggy

from drivetrain import hookspecs
from drivetrain.errors import PluginError

ENTRY_POINT_GROUP = "drivetrain.plugins"
#: Public names that plugins add to ``drivetrain`` / ``drivetrain.utils`` (``DeepSpeedPlugin = "mod:obj"``).
EXPORTS_GROUP = "drivetrain.exports"
REFERENCE_BACKEND = "local"
PLUGIN_KINDS = ("device", "precision", "feature", "backend", "extension")
# Composition order: lower runs first in chained hooks (wrap_model, wrap_optimizer). See hookspecs.py.
_KIND_ORDER = {kind: position for position, kind in enumerate(PLUGIN_KINDS)}

trace_logger = logging.getLogger("drivetrain.plugins.trace")


@attrs.define(frozen=True)
class Capabilities:
    """What a backend promises; the conformance suite reports properties outside these as not applicable."""

    multi_process: bool = False
    sharded_state: bool = False
    precisions: tuple[str, ...] = ("no",)
    devices: tuple[str, ...] = ("cpu",)
    #: Between synchronisations each process's own gradients are in ``param.grad`` (DDP). False for
    #: backends that keep them elsewhere (FSDP2 accumulates unsharded gradients internally; DeepSpeed's
    #: engine reduces them inside backward), where ``no_sync`` cannot be observed through ``param.grad``.
    local_gradients: bool = True
    #: Weights themselves are kept in the 16-bit compute precision (DeepSpeed bf16), so training drifts
    #: further from fp32 weights than autocast does; the conformance suite uses its looser tolerance.
    low_precision_weights: bool = False


@attrs.define(frozen=True)
class PluginInfo:
    """What a plugin module declares about itself as ``PLUGIN_INFO = PluginInfo(...)``.

    Reading it imports the plugin module but never the plugin's third-party library.
    """

    kind: str = attrs.field(default="extension", validator=attrs.validators.in_(PLUGIN_KINDS))
    #: Contract version the plugin was written for (see ``hookspecs.CONTRACT_VERSION``).
    contract: str = hookspecs.CONTRACT_VERSION
    #: Importable names of third-party libraries the plugin needs (``("deepspeed",)``).
    requires: tuple[str, ...] = ()
    description: str = ""
    capabilities: Capabilities = Capabilities()
    #: For backends: the ``DistributedType`` name reported while it runs (``"MULTI_CPU"`` is decided by device).
    distributed_type: str | None = None
    #: For backends: the class of its configuration object (``FullyShardedDataParallelPlugin``).
    config_class: type | None = None
    #: For precision plugins: the ``mixed_precision`` values they provide (``("fp8",)``).
    precisions: tuple[str, ...] = ()
    #: For backends: chosen automatically when a script runs in several processes and nothing else is asked.
    select_for_multiprocess: bool = False
    #: For backends that place parameters themselves (DeepSpeed, FSDP meta-device loading).
    places_model: bool = False
    #: For backends whose engine handles mixed precision and loss scaling itself (DeepSpeed): no GradScaler.
    manages_precision: bool = False


@attrs.define
class DiscoveredPlugin:
    """An entry point seen in the metadata, possibly not yet imported."""

    name: str
    value: str
    distribution: str
    version: str
    entry_point: Any = attrs.field(default=None, repr=False)
    module: Any = attrs.field(default=None, repr=False)

    @property
    def loaded(self) -> bool:
        return self.module is not None

    @property
    def info(self) -> PluginInfo:
        return getattr(self.module, "PLUGIN_INFO", None) or PluginInfo()


@attrs.define
class ExtensionRegistry:
    """What plugins register through the ``register_extensions`` hook. Keys record the plugin's name."""

    trackers: dict[str, tuple[str, type]] = attrs.Factory(dict)
    commands: dict[str, tuple[str, Callable, Callable, str]] = attrs.Factory(dict)
    launch_options: list[tuple[str, Callable]] = attrs.Factory(list)
    launchers: dict[str, tuple[str, Callable]] = attrs.Factory(dict)
    #: name -> (plugin, getter(state), also on the Accelerator)
    state_attributes: dict[str, tuple[str, Callable, bool]] = attrs.Factory(dict)
    current_plugin: str = ""

    def add_tracker(self, name: str, tracker_class: type) -> None:
        """Make ``Accelerator(log_with=name)`` build ``tracker_class``."""
        self._claim(self.trackers, name, "tracker")
        self.trackers[name] = (self.current_plugin, tracker_class)

    def add_command(self, name: str, register_parser: Callable, run: Callable, help: str = "") -> None:
        """Add ``drivetrain <name>``. ``register_parser(parser)`` adds arguments; ``run(args)`` returns an
        exit code."""
        self._claim(self.commands, name, "command")
        self.commands[name] = (self.current_plugin, register_parser, run, help)

    def add_launch_options(self, add_arguments: Callable) -> None:
        """``add_arguments(parser)`` adds options to ``drivetrain launch``, shown under the plugin's name."""
        self.launch_options.append((self.current_plugin, add_arguments))

    def add_launcher(self, backend: str, launcher: Callable) -> None:
        """``launcher(args, script_argv) -> int`` replaces torch's elastic launcher for ``--backend backend``
        when it returns an exit code (return ``None`` to fall back to the elastic launcher)."""
        self._claim(self.launchers, backend, "launcher")
        self.launchers[backend] = (self.current_plugin, launcher)

    def add_state_attribute(self, name: str, getter: Callable, on_accelerator: bool = False) -> None:
        """Make ``AcceleratorState().<name>`` (and ``accelerator.<name>`` when ``on_accelerator``) return
        ``getter(state)``: the Accelerate spellings that belong to one backend (its active configuration, a
        method selecting one). Consulted only for names no kernel attribute has; the getter answers whatever
        backend runs (e.g. ``None`` when it is not its own, as Accelerate does)."""
        if name.startswith("_"):
            raise PluginError(
                f"plugin {self.current_plugin!r}: state attribute {name!r} must not start with '_'"
            )
        self._claim(self.state_attributes, name, "state attribute")
        self.state_attributes[name] = (self.current_plugin, getter, on_accelerator)

    def _claim(self, table: dict, name: str, what: str) -> None:
        if name in table and table[name][0] != self.current_plugin:
            raise PluginError(
                f"plugin {self.current_plugin!r} registers {what} {name!r}, already registered by plugin "
                f"{table[name][0]!r}; uninstall one of them or restrict loading with DRIVETRAIN_LOAD_PLUGINS"
            )


def _hook_specs() -> dict[str, list[str]]:
    """Hook name -> argument names, read from hookspecs.py."""
    specs = {}
    for name, function in inspect.getmembers(hookspecs, inspect.isfunction):
        if hasattr(function, f"{hookspecs.PROJECT_NAME}_spec"):
            specs[name] = list(inspect.signature(function).parameters)
    return specs


HOOK_SPECS: dict[str, list[str]] = _hook_specs()


def hook_implementations(plugin: Any) -> dict[str, Callable]:
    """The functions of ``plugin`` marked with ``@hookimpl``, by name."""
    marker = f"{hookspecs.PROJECT_NAME}_impl"
    found = {}
    for attribute in dir(plugin):
        try:
            value = getattr(plugin, attribute)
        except Exception:
            continue
        if callable(value) and hasattr(value, marker):
            found[attribute] = value
    return found


def validate_plugin(name: str, plugin: Any) -> None:
    """Reject a plugin whose hooks do not match the spec, naming the plugin, the hook and the argument."""
    info = getattr(plugin, "PLUGIN_INFO", None)
    if info is not None:
        if not isinstance(info, PluginInfo):
            raise PluginError(f"plugin {name!r}: PLUGIN_INFO must be a drivetrain.plugins.PluginInfo")
        wanted_major = info.contract.split(".")[0]
        have_major = hookspecs.CONTRACT_VERSION.split(".")[0]
        if wanted_major != have_major:
            raise PluginError(
                f"plugin {name!r} implements contract {info.contract}, but this drivetrain implements "
                f"contract {hookspecs.CONTRACT_VERSION}; install a version of the plugin built for "
                f"contract {have_major}.x or a drivetrain that provides contract {info.contract}"
            )
    for hook_name, function in hook_implementations(plugin).items():
        if hook_name not in HOOK_SPECS:
            close = difflib.get_close_matches(hook_name, HOOK_SPECS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginError(
                f"plugin {name!r} implements unknown hook {hook_name!r}{hint} "
                f"(known hooks: {', '.join(sorted(HOOK_SPECS))})"
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


def tracing_enabled() -> bool:
    return os.environ.get("DRIVETRAIN_TRACE_PLUGINS", "").lower() in ("1", "true", "yes", "on")


class PluginManager:
    """Discovers plugins from entry points, loads them on demand and validates them.

    One instance per process (:func:`get_plugin_manager`); :func:`reset_plugin_manager` forgets it.
    Plugins can also be registered directly (``register(name, module_or_object)``), which tests and
    notebooks use.
    """

    def __init__(self) -> None:
        self._pluggy = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pluggy.add_hookspecs(hookspecs)
        self._discovered: dict[str, DiscoveredPlugin] | None = None
        self._registered: dict[str, DiscoveredPlugin] = {}
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

    # -- loading ---------------------------------------------------------------------------------------------
    def load(self, name: str) -> DiscoveredPlugin:
        """Import and register plugin ``name`` (once). Raises PluginError naming what is wrong."""
        plugins = self.discovered()
        if name not in plugins:
            raise PluginError(unknown_plugin_message(name, plugins))
        record = plugins[name]
        if record.loaded:
            return record
        try:
            module = record.entry_point.load()
        except Exception as exc:
            raise PluginError(
                f"plugin {name!r} (distribution {record.distribution} {record.version}) failed to import "
                f"{record.value}: {type(exc).__name__}: {exc}"
            ) from exc
        self._register(record, module)
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
            extensions = self.extensions
            for table in (
                extensions.trackers,
                extensions.commands,
                extensions.launchers,
                extensions.state_attributes,
            ):
                for key in [key for key, value in table.items() if value[0] == name]:
                    del table[key]

    def _register(self, record: DiscoveredPlugin, plugin: Any) -> None:
        validate_plugin(record.name, plugin)
        self._pluggy.register(plugin, name=record.name)
        record.module = plugin
        function = hook_implementations(plugin).get("register_extensions")
        if function is not None:
            self.extensions.current_plugin = record.name
            try:
                function(self.extensions)
            finally:
                self.extensions.current_plugin = ""

    def hooks_of(self, name: str) -> list[str]:
        """Hook names that plugin ``name`` implements (loads it)."""
        return sorted(hook_implementations(self.load(name).module))

    def info(self, name: str) -> PluginInfo:
        return self.load(name).info

    def _loadable(self) -> Iterator[tuple[str, PluginInfo]]:
        """Each plugin's name and info, in name order, importing a plugin module only when reached.

        A plugin that fails to load is left out with a warning naming it and why, so that one broken
        extension cannot stop a training run that does not use it; ``drivetrain plugins`` shows the error.
        """
        for name in self.names():
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
        return [name for name, info in self._loadable() if info.kind == kind]

    def multiprocess_backend(self) -> str | None:
        """The backend used when several processes run and none is named: the first by name of those that
        declare ``select_for_multiprocess``, or None. Plugin modules are imported in name order only until
        it is found (a later one cannot come first), which keeps the launcher's start-up short."""
        return next(
            (
                name
                for name, info in self._loadable()
                if info.kind == "backend" and info.select_for_multiprocess
            ),
            None,
        )

    def stack(self, names: Iterable[str]) -> PluginStack:
        """The active plugins for one Accelerator, in composition order, with ``local`` as the fallback."""
        return PluginStack(self, list(names))


def unknown_plugin_message(name: str, plugins: dict[str, DiscoveredPlugin]) -> str:
    installed = ", ".join(sorted(plugins)) or "none"
    restricted = ""
    if _allowed_names() is not None:
        restricted = f" (DRIVETRAIN_LOAD_PLUGINS={os.environ['DRIVETRAIN_LOAD_PLUGINS']} restricts loading)"
    return (
        f"unknown drivetrain plugin {name!r}; installed: {installed}{restricted}. "
        f"Install it with: pip install drivetrain-{name}"
    )


def check_requirements(info: PluginInfo) -> str | None:
    """Import the plugin's third-party libraries; return why one fails, or None when all import."""
    for requirement in info.requires:
        try:
            # Some libraries print on import (deepspeed's accelerator banner); keep stdout for our output.
            with contextlib.redirect_stdout(sys.stderr):
                importlib.import_module(requirement)
        except Exception as exc:
            return f"{requirement} does not import: {type(exc).__name__}: {exc}"
    return None


class PluginStack:
    """The plugins active for one Accelerator, and the two ways the kernel calls their hooks.

    Helpers are named after the hook's semantics (``first`` for first-result hooks, ``chain`` for hooks
    that thread a value) so a call site cannot forget which one it is.
    """

    def __init__(self, manager: PluginManager, names: list[str]) -> None:
        for name in names:
            manager.load(name)
        ordered = sorted(names, key=lambda n: _KIND_ORDER[manager.info(n).kind])
        self.names = ordered
        fallback = [REFERENCE_BACKEND] if REFERENCE_BACKEND not in ordered else []
        if fallback:
            manager.load(REFERENCE_BACKEND)
        self._manager = manager
        self._first_order = ordered + fallback
        self._trace = tracing_enabled()
        self._cache: dict[tuple[str, bool], list[tuple[str, Callable, tuple[str, ...]]]] = {}

    def implementations(self, hook: str, with_fallback: bool) -> list[tuple[str, Callable, tuple[str, ...]]]:
        """(plugin name, function, argument names) for ``hook``, in call order."""
        key = (hook, with_fallback)
        if key not in self._cache:
            order = self._first_order if with_fallback else self.names
            found = []
            for name in order:
                function = hook_implementations(self._manager.load(name).module).get(hook)
                if function is not None:
                    found.append((name, function, tuple(inspect.signature(function).parameters)))
            self._cache[key] = found
        return self._cache[key]

    def first(self, hook: str, **kwargs: Any) -> Any:
        """Call a first-result hook: the first non-None answer wins (``local`` answers last)."""
        for name, function, argnames in self.implementations(hook, True):
            result = self._call(hook, name, function, argnames, kwargs)
            if result is not None:
                return result
        return None

    def first_callable(self, hook: str) -> Callable[..., Any]:
        """A function equal to ``lambda **kw: self.first(hook, **kw)``, pre-resolved for hot paths (one
        implementation and no tracing: the implementation itself)."""
        impls = self.implementations(hook, True)
        if len(impls) == 1 and not self._trace:
            name, function, argnames = impls[0]

            def call(**kwargs: Any) -> Any:
                try:
                    return function(**{a: kwargs[a] for a in argnames})
                except BaseException as exc:
                    _note(exc, hook, name)
                    raise

            return call
        return lambda **kwargs: self.first(hook, **kwargs)

    def chain(self, hook: str, value_name: str, value: Any, **kwargs: Any) -> Any:
        """Call a chained hook: each plugin gets the previous plugin's result (None keeps it)."""
        implementations = self.implementations(hook, False)
        if not implementations:
            implementations = [i for i in self.implementations(hook, True) if i[0] == REFERENCE_BACKEND]
        for name, function, argnames in implementations:
            result = self._call(hook, name, function, argnames, {**kwargs, value_name: value})
            if result is not None:
                value = result
        return value

    def implements(self, hook: str) -> bool:
        return bool(self.implementations(hook, False))

    def _call(self, hook: str, name: str, function: Callable, argnames: tuple[str, ...], kwargs: dict) -> Any:
        arguments = {argument: kwargs[argument] for argument in argnames}
        start = time.perf_counter() if self._trace else 0.0
        try:
            return function(**arguments)
        except BaseException as exc:
            _note(exc, hook, name)
            raise
        finally:
            if self._trace:
                elapsed_ms = (time.perf_counter() - start) * 1000
                _emit_trace(f"hook {hook} -> plugin {name} ({elapsed_ms:.3f} ms)")


def _note(exc: BaseException, hook: str, plugin: str) -> None:
    """Name the plugin and hook on an exception without changing its type (callers catch OOM etc.)."""
    note = f"raised in hook {hook!r} of drivetrain plugin {plugin!r}"
    if note not in getattr(exc, "__notes__", ()):
        if sys.version_info >= (3, 11):
            exc.add_note(note)
        else:  # pragma: no cover - Python 3.10 has no add_note
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def _emit_trace(message: str) -> None:
    if not trace_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[drivetrain trace] %(message)s"))
        trace_logger.addHandler(handler)
        trace_logger.setLevel(logging.INFO)
        trace_logger.propagate = False
    trace_logger.info(message)


_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process's plugin manager (created on first use; discovery reads metadata only)."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
    return _manager


def reset_plugin_manager() -> None:
    """Forget every discovered and registered plugin (the next use discovers again)."""
    global _manager
    _manager = None


def registered_attribute(name: str, state: Any, owner: str, on_accelerator: bool = False) -> Any:
    """The value of the attribute ``name`` a plugin registered with ``registry.add_state_attribute`` (for
    ``AcceleratorState.__getattr__`` and ``Accelerator.__getattr__``, i.e. names nothing else has).

    Plugins not loaded yet are loaded (their modules only) when the name is not registered: a script may ask
    ``accelerator.state.deepspeed_plugin`` in a run of another backend. Raises AttributeError otherwise."""
    missing = AttributeError(f"{owner!r} object has no attribute {name!r}")
    if name.startswith("_"):  # private and dunder lookups (copy, pickle, hasattr probes) never load plugins
        raise missing
    manager = get_plugin_manager()
    entry = manager.extensions.state_attributes.get(name)
    if entry is None:
        for plugin in manager.names():
            with contextlib.suppress(PluginError):  # a broken plugin is reported where it is used
                manager.load(plugin)
        entry = manager.extensions.state_attributes.get(name)
    if entry is None or (on_accelerator and not entry[2]):
        raise missing
    return entry[1](state)


def resolve_export(name: str) -> Any:
    """Resolve a plugin-provided public name (``DeepSpeedPlugin``) through the ``drivetrain.exports``
    entry-point group. Raises ImportError naming the distribution to install."""
    for entry_point in importlib_metadata.entry_points(group=EXPORTS_GROUP):
        if entry_point.name == name:
            return entry_point.load()
    from drivetrain.compat import PLUGIN_EXPORTS

    distribution = PLUGIN_EXPORTS.get(name)
    if distribution is None:
        raise AttributeError(name)
    raise ImportError(f"{name} is provided by a plugin: pip install {distribution}")
