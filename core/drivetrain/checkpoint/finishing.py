"""Finishing a save after ``save_state`` has returned: fsync, checksums, manifest, rename, pruning.

Writing a checkpoint's bytes into the page cache takes as long with drivetrain as with any library; making
them durable takes as long as the disk needs (about a second per GB on ordinary disks). ``save_state``
returns after the first part and the writing process finishes the second on a background thread, in the
same order a blocking save uses: every file fsynced, the manifest written last, then the rename. Until
then the checkpoint exists only as its ``.<name>.incomplete`` folder, which nothing loads: a crash at any
moment still leaves the previous checkpoint as the latest one.

The background thread runs no collective (only the thread that issued the others may), so the processes
meet only when the outcome is collected: ``Accelerator.wait_for_checkpoint``, which every later checkpoint
operation, ``wait_for_everyone`` and ``end_training`` call first. A process that exits while a save is
finishing completes it before exiting (the thread is not a daemon); a failure nobody collected is printed
on stderr at exit.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Callable


class FinishingSave:
    """One save's finishing work, running on its own thread from construction (``work=None``: this process
    has nothing to finish, its files are another process's to seal)."""

    def __init__(
        self, location: str, work: Callable[[], list[str] | None] | None, iteration: int | None = None
    ) -> None:
        self.location = location
        self.iteration = iteration  # the automatic checkpoint number it takes, if any
        self._error: BaseException | None = None
        #: what went wrong after the checkpoint was complete (pruning older ones): warnings, not failures
        self.warnings: list[str] = []
        self._thread: threading.Thread | None = None
        if work is not None:
            self._thread = threading.Thread(target=self._run, args=(work,), name="drivetrain-finish-save")
            _uncollected.add(self)
            self._thread.start()

    def _run(self, work: Callable[[], list[str] | None]) -> None:
        try:
            self.warnings = list(work() or [])
        except BaseException as exc:  # handed to whoever collects the outcome
            self._error = exc

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> BaseException | None:
        """Block until finished; the error that stopped it, or None once the checkpoint is complete."""
        if self._thread is not None:
            self._thread.join()
        _uncollected.discard(self)
        return self._error


#: Saves started and not yet collected by anyone (only the main thread adds and removes).
_uncollected: set[FinishingSave] = set()


def wait_for_all() -> list[FinishingSave]:
    """Wait for every save still finishing in this process; returns those that failed or warned,
    uncollected."""
    reported = []
    for save in list(_uncollected):
        if save.wait() is not None or save.warnings:
            reported.append(save)
    return reported


@atexit.register
def _report_failures_at_exit() -> None:
    # Runs after the interpreter joined the finishing threads: only failures and warnings are left to tell.
    for save in wait_for_all():
        for warning in save.warnings:
            print(f"drivetrain: warning: {warning}", file=sys.stderr)
        if save._error is None:
            continue
        print(
            f"drivetrain: the checkpoint {save.location} could not be finished "
            f"({type(save._error).__name__}: {save._error}); earlier checkpoints are untouched",
            file=sys.stderr,
        )
