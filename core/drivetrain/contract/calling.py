"""Calling the hooks of the plugins active for one Accelerator: the one mechanism, driven by the specs.

A :class:`PluginStack` owns a pluggy ``PluginManager`` holding only the active plugins. pluggy calls the most
recently registered plugin first, so they are registered in reverse composition order: ``local`` first (it
answers last), then the backend, then feature, precision and device plugins. First-result and broadcast hooks
are pluggy's own hook callers (``stack.hook.backward(...)``; the per-step ``caller`` calls plain first-result
implementations directly, in pluggy's order); a chain hook calls each plugin's hook caller in
turn, threading the value. ``DRIVETRAIN_TRACE_PLUGINS=1`` logs every call through pluggy's hook-call
monitoring, naming the implementations that ran (a first-result hook stops at the first answer).
"""

from __future__ import annotations

import logging
import operator
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pluggy
from pluggy import HookImpl

from drivetrain.config import sources
from drivetrain.contract import hookspecs
from drivetrain.contract.attribution import attribute
from drivetrain.contract.info import KIND_ORDER

trace_logger = logging.getLogger("drivetrain.plugins.trace")


def tracing_enabled() -> bool:
    return sources.env_flag("DRIVETRAIN_TRACE_PLUGINS")


class PluginStack:
    """The plugins active for one Accelerator (or one process's set-up), and how their hooks are called.

    ``call(hook, **arguments)`` calls any hook the way its spec says; ``caller(hook)`` returns the same call
    pre-resolved for hot paths (``backward`` on every step).
    """

    def __init__(self, plugins: list[tuple[str, str, Any]], fallback: tuple[str, Any]) -> None:
        ordered = sorted(plugins, key=lambda plugin: KIND_ORDER[plugin[1]])
        #: the active plugins in composition order (without the fallback unless it is the backend)
        self.names = [name for name, _, _ in ordered]
        self._pluggy = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pluggy.add_hookspecs(hookspecs)
        objects = {name: hooks for name, _, hooks in ordered}
        if fallback[0] not in objects:
            objects = {**objects, fallback[0]: fallback[1]}
        self._objects = objects
        for name in reversed(list(objects)):
            self._pluggy.register(objects[name], name=name)
        if tracing_enabled():
            self._pluggy.add_hookcall_monitoring(_trace_before, _trace_after)
            _record_which_ran(self._pluggy)
        self.hook = self._pluggy.hook
        self._single: dict[tuple[str, str], Any] = {}

    def implementers(self, hook: str) -> list[str]:
        """Names of the plugins that implement ``hook``, in the order they are called."""
        return [impl.plugin_name for impl in reversed(getattr(self.hook, hook).get_hookimpls())]

    def implements(self, hook: str) -> bool:
        """Whether an active plugin other than the fallback implements ``hook``."""
        return any(name in self.names for name in self.implementers(hook))

    def call(self, hook: str, **arguments: Any) -> Any:
        """Call ``hook`` as its spec says: the first non-None answer, the chained value, or None. An error
        keeps its type and gains a note naming the plugin that raised it."""
        try:
            style, chained = hookspecs.HOOK_STYLES[hook]
            if style != "chain":
                return getattr(self.hook, hook)(**arguments)
            assert chained is not None  # a chain hook names the argument it threads
            value = arguments[chained]
            for name in self.implementers(hook):
                # pluggy returns the list of non-None results of the (here: one) implementation called
                results = self._caller_of(hook, name)(**{**arguments, chained: value})
                if results:
                    value = results[0]
            return value
        except BaseException as exc:
            attribute(exc, hook, getattr(self.hook, hook).get_hookimpls())
            raise

    def caller(self, hook: str) -> Callable[..., Any]:
        """``lambda **arguments: self.call(hook, **arguments)``, resolved once for hot paths (``backward``
        runs every step).

        A first-result hook whose implementations are plain functions (no wrappers, no defaulted arguments)
        is called directly, in the order pluggy's hook caller gives: pluggy's per-call argument checks and
        result bookkeeping cost 5-7 µs a call, about 3% of a small model's step (``bench/step_overhead.py``).
        The stack never changes after it is built, so the resolved order stays right. With tracing on, or
        any implementation pluggy must treat specially, the call goes through pluggy's hook caller."""
        if hookspecs.HOOK_STYLES[hook][0] == "chain":
            return lambda **arguments: self.call(hook, **arguments)
        hook_caller = getattr(self.hook, hook)
        direct = None if tracing_enabled() else _direct_first_result(hook_caller)

        def call(**arguments: Any) -> Any:
            try:
                if direct is not None:
                    try:
                        return direct(arguments)
                    except _MissingArgument:
                        pass  # pluggy's caller raises its own HookCallError naming the argument
                return hook_caller(**arguments)
            except BaseException as exc:
                attribute(exc, hook, hook_caller.get_hookimpls())
                raise

        return call

    def _caller_of(self, hook: str, name: str) -> Any:
        """pluggy's hook caller restricted to plugin ``name`` (so monitoring sees each link of a chain)."""
        key = (hook, name)
        if key not in self._single:
            others = [obj for other, obj in self._objects.items() if other != name]
            self._single[key] = self._pluggy.subset_hook_caller(hook, others)
        return self._single[key]


class _MissingArgument(Exception):
    """A direct call lacked an argument an implementation takes (pluggy's caller reports it)."""


def _direct_first_result(hook_caller: Any) -> Callable[[Mapping[str, Any]], Any] | None:
    """The implementations of a first-result hook as one plain function of the call's arguments, or None
    when pluggy must run them itself (wrappers, implementations with defaulted arguments, a broadcast hook)."""
    if not (hook_caller.spec and hook_caller.spec.opts.get("firstresult")):
        return None
    impls = list(reversed(hook_caller.get_hookimpls()))  # pluggy calls the last registered first
    if any(impl.hookwrapper or impl.wrapper or impl.kwargnames for impl in impls):
        return None
    calls = [(impl.function, _arguments_getter(impl.argnames)) for impl in impls]
    if len(calls) == 1:
        function, arguments_of = calls[0]

        def only_answer(arguments: Mapping[str, Any]) -> Any:
            try:
                values = arguments_of(arguments)
            except KeyError:
                raise _MissingArgument from None
            return function(*values)

        return only_answer
    all_arguments = _arguments_getter(tuple({name: None for impl in impls for name in impl.argnames}))

    def first_result(arguments: Mapping[str, Any]) -> Any:
        try:
            all_arguments(arguments)  # checked before any implementation runs, as pluggy does
        except KeyError:
            raise _MissingArgument from None
        for function, arguments_of in calls:
            result = function(*arguments_of(arguments))
            if result is not None:
                return result
        return None

    return first_result


def _arguments_getter(names: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of ``names`` in a call's arguments, as a tuple (``operator.itemgetter`` returns a bare value
    for one name)."""
    if len(names) == 1:
        (name,) = names
        return lambda arguments: (arguments[name],)
    if not names:
        return lambda arguments: ()
    return operator.itemgetter(*names)


_started: dict[int, float] = {}
#: Per thread, one list per hook call in progress (hooks may call hooks): the plugins whose implementation ran.
_calls = threading.local()


def _record_which_ran(manager: pluggy.PluginManager) -> None:
    """Make every implementation note its plugin when it runs, so that a trace names those that ran, not
    those that could have (a first-result hook stops at the first answer). Tracing only."""
    for hook_caller in manager.hook.__dict__.values():
        for impl in hook_caller.get_hookimpls():
            impl.function = _noting(impl.plugin_name, impl.function)


def _noting(plugin: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def noted(*args: Any) -> Any:
        running = getattr(_calls, "stack", None)
        if running:
            running[-1].append(plugin)
        return function(*args)

    return noted


def _trace_before(hook_name: str, hook_impls: Sequence[HookImpl], kwargs: Mapping[str, Any]) -> None:
    if not hasattr(_calls, "stack"):
        _calls.stack = []
    _calls.stack.append([])
    _started[id(kwargs)] = time.perf_counter()


def _trace_after(
    outcome: Any, hook_name: str, hook_impls: Sequence[HookImpl], kwargs: Mapping[str, Any]
) -> None:
    elapsed_ms = (time.perf_counter() - _started.pop(id(kwargs), time.perf_counter())) * 1000
    ran = _calls.stack.pop() if getattr(_calls, "stack", None) else []
    plugins = ", ".join(ran) or "(none)"
    _emit_trace(f"hook {hook_name} -> plugin {plugins} ({elapsed_ms:.3f} ms)")


def _emit_trace(message: str) -> None:
    if not trace_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[drivetrain trace] %(message)s"))
        trace_logger.addHandler(handler)
        trace_logger.setLevel(logging.INFO)
        trace_logger.propagate = False
    trace_logger.info(message)
