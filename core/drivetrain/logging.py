"""A logger for multi-process runs: each record prints once (from the main process) unless asked otherwise.

``get_logger(__name__)`` returns an adapter around :func:`logging.getLogger`. Its calls take two extra
keyword arguments: ``main_process_only`` (default ``True``) and ``in_order`` (default ``False``; with
``main_process_only=False`` the processes print one after the other, rank 0 first).
``DRIVETRAIN_LOG_LEVEL`` sets the level when ``log_level`` is not given.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from drivetrain.config import process_env

LOG_LEVEL_ENV = "DRIVETRAIN_LOG_LEVEL"


def _initialized_state() -> Any:
    """The shared PartialState when one exists. Never creates one: that would start the process group."""
    from drivetrain.state import PartialState

    return PartialState() if PartialState._shared_state else None


def process_rank(local: bool = False) -> int:
    """This process's global (or local) rank: from the process state when it exists, else from the
    launcher's ``RANK`` / ``LOCAL_RANK`` variables (0 in a plain ``python script.py``)."""
    state = _initialized_state()
    if state is not None:
        return state.local_process_index if local else state.process_index
    return process_env.whole_number("LOCAL_RANK" if local else "RANK", 0) or 0


class MultiProcessAdapter(logging.LoggerAdapter):
    """Logger adapter whose calls accept ``main_process_only`` and ``in_order``.

    ``in_order=True`` with ``main_process_only=False`` is a collective: every process must make the call,
    because the processes take turns with a barrier between turns.
    """

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        if main_process_only:
            if process_rank() == 0:
                self._emit(level, msg, args, kwargs)
            return
        if not in_order:
            self._emit(level, msg, args, kwargs)
            return
        state = _initialized_state()
        if state is None:
            if process_env.world_size() > 1:
                raise RuntimeError(
                    "logging with in_order=True needs the process state to take turns: create the "
                    "Accelerator (or PartialState()) before logging"
                )
            self._emit(level, msg, args, kwargs)
            return
        for turn in range(state.num_processes):
            if turn == state.process_index:
                self._emit(level, msg, args, kwargs)
            state.wait_for_everyone()

    def _emit(self, level: int, msg: Any, args: tuple, kwargs: dict) -> None:
        msg, kwargs = self.process(msg, kwargs)
        # One frame deeper than the caller's stacklevel: this helper sits between them and logging.
        kwargs["stacklevel"] = kwargs["stacklevel"] + 1
        self.logger.log(level, msg, *args, **kwargs)
        for handler in self.logger.handlers:
            handler.flush()

    # LoggerAdapter's level methods call self.log(level, ...): route them all through ours, one frame deeper.
    def debug(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stacklevel", 3)
        self.log(logging.DEBUG, msg, *args, **kwargs)

    def info(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stacklevel", 3)
        self.log(logging.INFO, msg, *args, **kwargs)

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stacklevel", 3)
        self.log(logging.WARNING, msg, *args, **kwargs)

    def error(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stacklevel", 3)
        self.log(logging.ERROR, msg, *args, **kwargs)

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        kwargs.setdefault("stacklevel", 3)
        self.log(logging.ERROR, msg, *args, exc_info=exc_info, **kwargs)

    def critical(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stacklevel", 3)
        self.log(logging.CRITICAL, msg, *args, **kwargs)

    @functools.lru_cache(None)  # noqa: B019 - the cache is the point: one warning per distinct message
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` that prints each distinct message once per process."""
        kwargs.setdefault("stacklevel", 4)
        self.warning(*args, **kwargs)


def _check_level(log_level: str | int, source: str) -> str | int:
    if isinstance(log_level, int):
        return log_level
    level = log_level.strip().upper()
    if not isinstance(logging.getLevelName(level), int):  # known names map to their number
        raise ValueError(
            f"unknown log level {log_level!r} from {source}; use one of CRITICAL, ERROR, WARNING, INFO, DEBUG"
        )
    return level


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """A logger for ``name`` whose records print on the main process only unless the call passes
    ``main_process_only=False`` (add ``in_order=True`` to print rank by rank).

    :param log_level: level for this logger and the root logger (``"INFO"``, ``"DEBUG"``...); defaults to
        ``DRIVETRAIN_LOG_LEVEL`` when set, else the logging module's configuration is left alone.
    """
    source = "get_logger(log_level=...)"
    if log_level is None and os.environ.get(LOG_LEVEL_ENV):
        log_level, source = os.environ[LOG_LEVEL_ENV], LOG_LEVEL_ENV
    base = logging.getLogger(name)
    if log_level is not None:
        level = _check_level(log_level, source)
        base.setLevel(level)
        logging.getLogger().setLevel(level)
    return MultiProcessAdapter(base, {})
