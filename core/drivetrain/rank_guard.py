"""A launched process dies with its launcher, whatever ends the launcher (SIGKILL included).

torch's launcher starts each process in a session of its own, so a signal to the launcher's process group
does not reach it, and when the launcher is killed outright nothing stops the processes: they went on
training and writing checkpoints. On Linux the kernel can send a process a signal when its parent ends
(``prctl(PR_SET_PDEATHSIG)``); the setting survives ``exec``, so ``drivetrain launch`` starts each rank as

    python -I -S rank_guard.py LAUNCHER_PID -- COMMAND...

which asks for SIGKILL at the launcher's end, checks that the launcher did not end before that took effect,
and replaces itself with the rank's command: same process id, environment, signals and output, at the cost
of one interpreter start without ``site`` (about 20 ms). This file imports nothing from drivetrain (``-I``
keeps its folder off ``sys.path``): it runs before the rank, not inside it.

Elsewhere (macOS, Windows) there is no such request: the command runs unguarded, as before. Processes that
a rank starts itself are its own (Python's DataLoader workers end when their rank does).
"""

from __future__ import annotations

import os
import sys

#: prctl option: the signal this process gets when its parent thread ends (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def supported() -> bool:
    return sys.platform.startswith("linux")


def die_with_parent(parent_pid: int) -> bool:
    """Have the kernel SIGKILL this process when its parent ends. False when the parent (``parent_pid``)
    is gone already, and the caller must not start; True otherwise (also where it cannot be asked)."""
    if not supported():
        return True
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return True  # refused (a sandbox): run unguarded rather than not at all
    # The parent may have ended between this process's start and the request: then it was adopted by
    # another process, and no signal will come.
    return os.getppid() == parent_pid


def guarded(command: list[str]) -> list[str]:
    """``command`` started through this guard for a launcher that is this process (unchanged where the
    guard cannot work)."""
    if not supported():
        return list(command)
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), "--", *command]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: rank_guard.py LAUNCHER_PID -- COMMAND...", file=sys.stderr)
        return 2
    launcher, command = int(argv[0]), argv[2:]
    if not die_with_parent(launcher):
        print(f"drivetrain: the launcher (pid {launcher}) ended before this process started", file=sys.stderr)
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"drivetrain: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
