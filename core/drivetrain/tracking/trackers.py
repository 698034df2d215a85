"""Experiment tracking: the ``GeneralTracker`` base class, how ``log_with`` is resolved, and the
Accelerator's tracking methods (:class:`TrackingMixin`).

The kernel ships no tracker. Plugins register tracker classes by name through the ``register_extensions``
hook (``registry.add_tracker("tensorboard", TensorBoardTracker)``); ``drivetrain-trackers`` provides the
seven that Accelerate knows. ``log_with`` accepts registered names, ``LoggerType`` members, ``"all"`` (every
registered tracker whose library imports here), ``GeneralTracker`` instances, or a list mixing them.

Only the main process writes, unless a tracker sets ``main_process_only = False``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from drivetrain.compat.distributions import TRACKERS_DISTRIBUTION
from drivetrain.errors import ConfigurationError, PluginError
from drivetrain.logging import process_rank

logger = logging.getLogger(__name__)

ALL = "all"


def on_main_process(function: Callable) -> Callable:
    """Decorator for tracker methods: run only on the main process when the tracker's
    ``main_process_only`` is true (the default); on every process otherwise."""

    @functools.wraps(function)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", True) and process_rank() != 0:
            return None
        return function(self, *args, **kwargs)

    return run


class GeneralTracker:
    """Base class of every tracker.

    A subclass sets the class attributes ``name`` (unique, used by ``log_with`` and ``get_tracker``) and
    ``requires_logging_directory`` (its ``__init__`` then takes ``(run_name, logging_dir, **kwargs)``,
    otherwise ``(run_name, **kwargs)``), implements the ``tracker`` property (the library's own run object),
    ``store_init_configuration(values)``, ``log(values, step, **kwargs)`` and, when it has something to
    close, ``finish()``. ``requires`` names the libraries it imports; ``"all"`` skips trackers whose
    libraries do not import. ``main_process_only = False`` makes the Accelerator call it on every process.
    """

    name: str
    requires_logging_directory: bool = False
    main_process_only: bool = True
    requires: tuple[str, ...] = ()

    def __init__(self, _blank: bool = False) -> None:
        if not _blank:
            check_tracker_class(type(self))

    @property
    def tracker(self) -> Any:
        """The library's own object (a wandb run, a SummaryWriter, ...)."""
        return None

    def start(self) -> None:
        """Create the library's run. ``init_trackers`` calls it once on every tracker it built or was given,
        after building them all and before ``store_init_configuration`` (Accelerate's order), so a tracker can
        defer work that needs the processes to be set up."""

    def store_init_configuration(self, values: dict) -> None:
        """Record ``values`` once as the experiment's hyperparameters."""

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (name -> number, or what the library accepts) at ``step``."""

    def finish(self) -> None:
        """Flush and close; called by ``Accelerator.end_training()``."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this tracker's libraries do not import here, or None when they do."""
        import importlib

        for requirement in cls.requires:
            try:
                importlib.import_module(requirement)
            except Exception as exc:
                return f"{requirement} does not import: {type(exc).__name__}: {exc}"
        return None


class _InactiveTracker(GeneralTracker):
    """Returned by ``get_tracker`` on a process where the named tracker does not run: every method call is
    a no-op and ``tracker`` is None, so code written for the main process runs unchanged elsewhere."""

    requires_logging_directory = False

    def __init__(self, name: str) -> None:
        super().__init__(_blank=True)
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return lambda *args, **kwargs: None

    def __repr__(self) -> str:
        return f"<inactive tracker {self.name!r} (it writes on the main process only)>"


def check_tracker_class(cls: type) -> None:
    """Reject a tracker class that lacks what the Accelerator needs, naming what is missing."""
    missing = []
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        missing.append("`name` (a non-empty str class attribute)")
    if not isinstance(getattr(cls, "requires_logging_directory", None), bool):
        missing.append("`requires_logging_directory` (a bool class attribute)")
    if not hasattr(cls, "tracker"):
        missing.append("`tracker` (a property returning the library's run object)")
    if missing:
        raise NotImplementedError(f"tracker class {cls.__name__} must define: {', '.join(missing)}")


# ---------------------------------------------------------------------------------------------------------
# The registry and log_with
# ---------------------------------------------------------------------------------------------------------


def registered_trackers() -> dict[str, tuple[str, type]]:
    """Tracker name -> (plugin name, class) for every tracker that an installed plugin registers.

    Loads every plugin module (never their third-party libraries). A plugin that fails to load is reported
    as a warning and skipped, so one broken plugin does not take tracking down with it.
    """
    from drivetrain.contract.registry import get_plugin_registry

    manager = get_plugin_registry()
    for name in manager.names():
        try:
            manager.load(name)
        except PluginError as exc:
            logger.warning("skipping plugin %r while looking for trackers: %s", name, exc)
    return {**manager.extensions.trackers, **{name: ("user", cls) for name, cls in _USER_TRACKERS.items()}}


#: Tracker classes registered with :func:`register_tracker_class`, by name.
_USER_TRACKERS: dict[str, type] = {}


def register_tracker_class(tracker_class: type) -> None:
    """Make ``tracker_class`` (a :class:`GeneralTracker` subclass with a non-empty ``name`` and a
    ``requires_logging_directory`` class attribute) usable by name in ``log_with``, like the trackers plugins
    register (Accelerate's ``register_tracker_class``). Register before building the Accelerator. A name already
    in use is taken over, with a warning."""
    import warnings

    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"`tracker_class` must be a subclass of `GeneralTracker`, but got {tracker_class}.")
    if not getattr(tracker_class, "name", None):
        raise ValueError("The tracker class to register must define a non-empty `name` attribute.")
    if "requires_logging_directory" not in {
        name for cls in tracker_class.__mro__[:-1] if cls is not GeneralTracker for name in vars(cls)
    }:
        raise ValueError(
            "The tracker class to register must define a `requires_logging_directory` class attribute. "
            "Set it to `True` if the tracker needs a logging directory, or `False` otherwise."
        )
    if tracker_class.name in registered_trackers():
        warnings.warn(
            f"A tracker with the name '{tracker_class.name}' is already registered and will be overwritten by "
            f"{tracker_class}. This is especially significant when shadowing a built-in tracker.",
            stacklevel=2,
        )
    _USER_TRACKERS[tracker_class.name] = tracker_class


def _as_list(log_with: Any) -> list[Any]:
    if log_with is None:
        return []
    if isinstance(log_with, (list, tuple)):
        return list(log_with)
    return [log_with]


def _entry_name(entry: Any) -> str:
    """The tracker name a ``log_with`` entry stands for (``LoggerType.WANDB`` -> ``"wandb"``)."""
    if isinstance(entry, GeneralTracker):
        return entry.name
    if isinstance(entry, str):  # LoggerType members are str too
        return str(entry.value if hasattr(entry, "value") else entry)
    if isinstance(entry, type) and issubclass(entry, GeneralTracker):
        raise ConfigurationError(
            f"log_with got the tracker class {entry.__name__}; pass an instance ({entry.__name__}(...)) or "
            f"its registered name"
        )
    raise ConfigurationError(
        f"log_with entries must be tracker names, LoggerType members or GeneralTracker instances, "
        f"not {type(entry).__name__} ({entry!r})"
    )


def _unknown_tracker_message(name: str, registered: dict[str, tuple[str, type]]) -> str:
    from drivetrain.config.enums import LoggerType

    available = ", ".join(sorted(registered)) or "none"
    message = f'unknown tracker {name!r} in log_with; trackers installed: {available} (or "all").'
    if name in LoggerType.list():
        message += f" Install it with: pip install '{TRACKERS_DISTRIBUTION}[{name}]'"
    else:
        message += " A custom tracker can be passed as a GeneralTracker instance or registered by a plugin"
    return message


def _check_logging_dir(cls: type, logging_dir: str | None) -> None:
    if cls.requires_logging_directory and logging_dir is None:
        raise ConfigurationError(
            f"Logging with `{cls.name}` requires a `logging_dir` to be passed in: pass "
            f"Accelerator(project_dir=...) or project_config=ProjectConfiguration(logging_dir=...)"
        )


_NOT_CHECKED = object()


def resolve_log_with(log_with: Any, logging_dir: Any = _NOT_CHECKED) -> list[GeneralTracker | type]:
    """Turn ``log_with`` into tracker instances (given by the user) and classes (to build), without
    duplicates, in the order given (``"all"`` expands where it stands).

    Raises :class:`~drivetrain.errors.ConfigurationError` for an unknown name (listing the installed
    trackers), a named tracker whose library does not import, or a named tracker that needs a logging
    directory when there is none. ``"all"`` silently leaves out trackers that cannot run here.
    """
    entries = _as_list(log_with)
    names = [_entry_name(entry) for entry in entries]
    registered = registered_trackers() if any(not isinstance(e, GeneralTracker) for e in entries) else {}
    resolved: list[GeneralTracker | type] = []
    seen: set[str] = set()

    def add(name: str, item: GeneralTracker | type) -> None:
        if name not in seen:
            seen.add(name)
            resolved.append(item)

    for entry, name in zip(entries, names):
        if isinstance(entry, GeneralTracker):
            add(name, entry)
        elif name != ALL:
            if name not in registered:
                raise ConfigurationError(_unknown_tracker_message(name, registered))
            plugin, cls = registered[name]
            reason = cls.unavailable_reason()
            if reason is not None:
                raise ConfigurationError(
                    f"tracker {name!r} (plugin {plugin!r}) cannot run here: {reason}. "
                    f"Install it with: pip install '{TRACKERS_DISTRIBUTION}[{name}]'"
                )
            if logging_dir is not _NOT_CHECKED:
                _check_logging_dir(cls, logging_dir)
            add(name, cls)
    if ALL in names:
        for name, (_plugin, cls) in sorted(registered.items()):
            if name in seen:
                continue
            reason = cls.unavailable_reason()
            if reason is not None:
                logger.debug("log_with='all' leaves out tracker %r: %s", name, reason)
            elif logging_dir is None and cls.requires_logging_directory:
                logger.warning("log_with='all' leaves out tracker %r: it needs a logging directory", name)
            else:
                add(name, cls)
    return resolved


def validate_log_with(log_with: Any, logging_dir: Any = _NOT_CHECKED) -> None:
    """Check ``log_with`` when the Accelerator is built, so a typo fails before training starts."""
    resolve_log_with(log_with, logging_dir)


# ---------------------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------------------


def _plain_value(value: Any) -> Any:
    """One-element tensors and numpy scalars become Python numbers, which every tracker library accepts
    (``accelerator.log({"loss": loss})`` with a tensor ``loss`` is the common case)."""
    if isinstance(value, dict):
        return {key: _plain_value(item) for key, item in value.items()}
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (str, bytes)):
        try:
            return item()
        except (ValueError, RuntimeError):  # more than one element: leave it to the tracker
            return value
    return value


def plain_values(values: dict) -> dict:
    """``values`` with scalar tensors and numpy scalars turned into Python numbers."""
    if not isinstance(values, dict):
        raise TypeError(f"Accelerator.log expects a dict of name -> value, got {type(values).__name__}")
    return {key: _plain_value(value) for key, value in values.items()}


# ---------------------------------------------------------------------------------------------------------
# The Accelerator's tracking methods
# ---------------------------------------------------------------------------------------------------------


class TrackingMixin:
    """``init_trackers``, ``log``, ``get_tracker`` and ``end_training`` for the Accelerator.

    The Accelerator sets ``self._log_with`` (the user's value) and ``self.trackers = []``. ``trackers``
    holds the trackers that write from this process: on the main process all of them, elsewhere only those
    with ``main_process_only = False``.
    """

    _log_with: Any
    trackers: list[GeneralTracker]

    def init_trackers(
        self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None
    ) -> None:
        """Start every tracker of ``log_with`` for the run ``project_name``.

        :param project_name: the run (or project) name handed to each tracker.
        :param config: hyperparameters stored once by each tracker (``store_init_configuration``).
        :param init_kwargs: tracker name -> keyword arguments for that tracker's constructor, e.g.
            ``{"wandb": {"entity": "me"}, "mlflow": {"tags": {...}}}``.
        """
        init_kwargs = dict(init_kwargs or {})
        logging_dir = self.logging_dir  # type: ignore[attr-defined]
        resolved = resolve_log_with(getattr(self, "_log_with", None), logging_dir)
        unknown = set(init_kwargs) - {entry.name for entry in resolved}
        if unknown:
            logger.warning(
                "init_kwargs names trackers that are not in log_with: %s", ", ".join(sorted(unknown))
            )
        is_main = self.is_main_process  # type: ignore[attr-defined]
        self.trackers = []
        self._tracker_names = [entry.name for entry in resolved]
        for entry in resolved:
            if entry.main_process_only and not is_main:
                continue  # built only where it writes: no empty runs from the other ranks
            if isinstance(entry, GeneralTracker):
                self.trackers.append(entry)
                continue
            kwargs = init_kwargs.get(entry.name, {})
            if entry.requires_logging_directory:
                tracker = entry(project_name, logging_dir, **kwargs)
            else:
                tracker = entry(project_name, **kwargs)
            self.trackers.append(tracker)
        for tracker in self.trackers:
            tracker.start()
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its library object with ``unwrap=True``).

        On a process where that tracker does not write, returns a stand-in whose methods do nothing.
        """
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        known = getattr(self, "_tracker_names", None)
        if known is None:
            raise ValueError(f"get_tracker({name!r}): call accelerator.init_trackers(...) first")
        if name in known:
            return _InactiveTracker(name)
        raise ValueError(
            f"{name!r} is not a tracker of this Accelerator; its trackers: {', '.join(known) or 'none'}"
        )

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log ``values`` at ``step`` with every tracker writing from this process.

        :param log_kwargs: tracker name -> extra keyword arguments for that tracker's ``log``.
        """
        log_kwargs = log_kwargs or {}
        values = plain_values(values)
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish (flush and close) every tracker writing from this process. The Accelerator's own
        ``end_training`` adds meeting the other processes."""
        for tracker in self.trackers:
            tracker.finish()
