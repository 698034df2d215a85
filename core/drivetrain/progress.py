"""Progress bars that do not repeat themselves once per process.

:func:`tqdm` is tqdm's bar shown on one process per machine (the local main process). :func:`progress`
is what drivetrain's own long operations (saving and loading large checkpoints, loading weights, merging
shards) use: a bar only on the local main process, only when stderr is a terminal, and never required —
without tqdm installed it does nothing. ``DRIVETRAIN_DISABLE_PROGRESS_BARS=1`` turns those bars off.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from drivetrain.config.sources import env_flag
from drivetrain.logging import process_rank

DISABLE_ENV = "DRIVETRAIN_DISABLE_PROGRESS_BARS"


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled on every process but the local main one unless
    ``main_process_only=False``. An explicit ``disable=True`` is always honoured."""
    try:
        from tqdm.auto import tqdm as tqdm_class
    except ImportError:
        raise ImportError("drivetrain.utils.tqdm needs the tqdm package: pip install tqdm") from None
    if args and isinstance(args[0], bool):
        raise ValueError(
            "tqdm(main_process_only, ...) positionally is not supported; pass main_process_only=... by keyword"
        )
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = process_rank(local=True) != 0
    return tqdm_class(*args, disable=disable, **kwargs)


class _Silent:
    """What :func:`progress` yields when no bar is shown."""

    def update(self, n: float = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass


def progress_enabled() -> bool:
    """Whether drivetrain's own operations show bars here: local main process, stderr a terminal, not
    turned off by ``DRIVETRAIN_DISABLE_PROGRESS_BARS``."""
    if env_flag(DISABLE_ENV):
        return False
    if process_rank(local=True) != 0:
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def progress(
    total: float | None, description: str, unit: str = "it", unit_scale: bool = False
) -> Iterator[Any]:
    """A bar for one of drivetrain's long operations; yields an object with ``update(n)``.

    ``with progress(total_bytes, "saving checkpoint", unit="B", unit_scale=True) as bar: ... bar.update(n)``
    """
    bar: Any = None
    if progress_enabled():
        try:
            from tqdm.auto import tqdm as tqdm_class
        except ImportError:
            tqdm_class = None
        if tqdm_class is not None:
            bar = tqdm_class(total=total, desc=description, unit=unit, unit_scale=unit_scale, leave=False)
    try:
        yield bar if bar is not None else _Silent()
    finally:
        if bar is not None:
            bar.close()


def track(
    items: Iterable[Any], description: str, total: int | None = None, unit: str = "it"
) -> Iterator[Any]:
    """Iterate ``items`` with a :func:`progress` bar (one step per item), for loops over files or shards."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(total, description, unit=unit) as bar:
        for item in items:
            yield item
            bar.update(1)
