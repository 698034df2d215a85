"""Automatic checkpoints (``project_dir/checkpoints/checkpoint_<n>``): one run writing them, picking the
newest that verifies, pruning the oldest.

One writer per ``project_dir``: the process that saves automatic checkpoints holds an exclusive ``flock``
on ``checkpoints/.drivetrain-writer.lock`` (which records its pid and host). A second run saving there is
refused with an error naming the first, before it writes anything; the kernel releases the lock when the
process ends, however it ends, so a killed run never leaves it stuck. Two Accelerators of one process
share it (a script that builds a new Accelerator to resume is still one run).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import threading
import time
import warnings

from drivetrain.checkpoint import files
from drivetrain.checkpoint.manifest import (
    MANIFEST_NAME,
    Verification,
    incomplete_path,
    is_complete,
    read_manifest,
    start_verification,
)
from drivetrain.checkpoint.publishing import recover, roll_forward
from drivetrain.errors import CheckpointError, CheckpointWarning

_CHECKPOINT_FOLDER = re.compile(r"^checkpoint_(\d+)$")
_INCOMPLETE_SUFFIX = ".incomplete"
_REPLACED_SUFFIX = ".replaced"
LOCK_NAME = ".drivetrain-writer.lock"


def checkpoint_number(path: str) -> int | None:
    """``n`` for a folder named ``checkpoint_<n>``, else None."""
    match = _CHECKPOINT_FOLDER.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def _numbered_folders(root: str) -> list[str]:
    """Every ``checkpoint_<n>`` folder under ``root``, oldest (smallest n) first, after finishing saves into
    any of them that were interrupted."""
    if not os.path.isdir(root):
        return []
    for name in os.listdir(root):
        if name.startswith(".checkpoint_") and name.endswith(_REPLACED_SUFFIX):
            recover(os.path.join(root, name[1 : -len(_REPLACED_SUFFIX)]))
    found = []
    for name in os.listdir(root):
        number = checkpoint_number(name)
        path = os.path.join(root, name)
        if number is not None and os.path.isdir(path):
            roll_forward(path)
            found.append((number, path))
    return [path for _, path in sorted(found)]


def complete_checkpoints(root: str) -> list[str]:
    """The complete ``checkpoint_<n>`` folders under ``root`` (manifest readable, files present with their
    sizes), oldest first."""
    return [path for path in _numbered_folders(root) if is_complete(path)]


def newest_verified(root: str, checksum: str = "fast") -> tuple[str, Verification]:
    """The newest ``checkpoint_<n>`` under ``root`` whose every file matches its manifest, checksums
    included, with its finished verification. Each newer one that does not is skipped with a
    :class:`CheckpointWarning` naming it and why; none at all is a :class:`CheckpointError`."""
    skipped = []
    for path in reversed(_numbered_folders(root)):
        try:
            verification = start_verification(path, checksum)
            verification.wait()
        except CheckpointError as exc:
            skipped.append(f"{os.path.basename(path)} ({exc})")
            continue
        for reason in skipped:
            warnings.warn(
                f"load_state(): skipped {reason}; loading {os.path.basename(path)}, the newest checkpoint "
                "that verifies",
                CheckpointWarning,
                stacklevel=4,
            )
        return path, verification
    detail = f"; skipped: {'; '.join(skipped)}" if skipped else ""
    raise CheckpointError(
        f"no complete checkpoint under {root} (a folder counts once its {MANIFEST_NAME} lists files that "
        f"are all present and match their checksums){detail}"
    )


# -- pruning -----------------------------------------------------------------------------------------------------
def prune(root: str, total_limit: int, keep: str) -> list[str]:
    """Delete the oldest complete checkpoints under ``root`` so at most ``total_limit`` remain, never
    ``keep`` (the one just written), and the leftovers of killed saves. Folders without a manifest that are
    not our temporaries are left alone: they may be someone else's; so are symbolic links (a checkpoint
    linked in from elsewhere is never deleted through its link), and files in a checkpoint folder that its
    manifest does not list (only the checkpoint's own files go). Returns the deleted paths; raises
    :class:`PruneError` naming what it could not delete after trying everything else."""
    deleted = []
    left: list[str] = []
    complete = [path for path in complete_checkpoints(root) if os.path.abspath(path) != os.path.abspath(keep)]
    excess = len(complete) + 1 - total_limit
    for path in complete[: max(excess, 0)]:
        if os.path.islink(path):
            left.append(f"{path} (a symbolic link: drivetrain deletes no checkpoint through a link)")
            continue
        # Rename first (atomic), so a crash mid-delete leaves a temporary, never a half-deleted checkpoint.
        doomed = incomplete_path(path)
        try:
            _remove_leftover(doomed)
            foreign = _unlisted_entries(path)
            if foreign:
                _move_checkpoint_files(path, doomed)
            else:
                os.rename(path, doomed)
        except (OSError, CheckpointError) as exc:
            left.append(f"{path} ({type(exc).__name__}: {exc})")
            continue
        deleted.append(path)
        if foreign:
            left.append(
                f"{path}: kept {', '.join(foreign[:5])}, which the checkpoint's manifest does not list"
            )
        try:
            shutil.rmtree(doomed)
        except OSError as exc:
            left.append(f"{doomed}, the remains of {os.path.basename(path)} ({type(exc).__name__}: {exc})")
    for name in os.listdir(root):
        if name.startswith(".checkpoint_") and name.endswith(_INCOMPLETE_SUFFIX):
            with contextlib.suppress(OSError):
                _remove_leftover(os.path.join(root, name))
    files.on_stage("pruned", root)
    if left:
        raise PruneError(left, deleted)
    return deleted


def _unlisted_entries(path: str) -> list[str]:
    """Files (and empty folders) in a checkpoint folder that its manifest does not list."""
    listed = set(read_manifest(path)["files"]) | {MANIFEST_NAME}
    found = []
    for folder, dirs, names in os.walk(path):
        for name in names + [d for d in dirs if not os.listdir(os.path.join(folder, d))]:
            relative = os.path.relpath(os.path.join(folder, name), path).replace(os.sep, "/")
            if relative not in listed:
                found.append(relative)
    return sorted(found)


def _move_checkpoint_files(path: str, doomed: str) -> None:
    """Move the manifest (first: the folder stops being a checkpoint at once) and the files it lists into
    ``doomed``, leaving everything else in ``path``."""
    listed = list(read_manifest(path)["files"])
    os.makedirs(doomed)
    os.rename(os.path.join(path, MANIFEST_NAME), os.path.join(doomed, MANIFEST_NAME))
    for relative in listed:
        target = os.path.join(doomed, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.rename(os.path.join(path, relative), target)


def _remove_leftover(path: str) -> None:
    """Remove a temporary folder of ours (a link is unlinked, never followed)."""
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.lexists(path):
        shutil.rmtree(path)


class PruneError(OSError):
    """Old checkpoints that pruning could not delete; the checkpoint just written is complete regardless."""

    def __init__(self, left: list[str], deleted: list[str]) -> None:
        self.left = left
        self.deleted = deleted
        super().__init__("could not delete " + "; ".join(left))


# -- one writer per project_dir ----------------------------------------------------------------------------------
#: The writer locks this process holds: lock file path -> [file descriptor, number of holders].
_held: dict[str, list[int]] = {}
_held_lock = threading.Lock()


def _describe_holder(fd: int) -> str:
    """Who holds the lock, as it wrote in the lock file. It writes right after taking the lock, so a record
    that is empty, or left by a process of this host that is gone, is read again for a moment."""
    deadline = time.monotonic() + 2
    while True:
        try:
            text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        if (text and not _left_by_a_dead_process(text)) or time.monotonic() > deadline:
            return text or "a process that has not written its name"
        time.sleep(0.02)


def _left_by_a_dead_process(record: str) -> bool:
    match = re.match(r"pid (\d+) on host (\S+),", record)
    if match is None or match.group(2) != socket.gethostname():
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def acquire_writer_lock(root: str) -> str:
    """Make this process the one that saves automatic checkpoints under ``root`` (see the module
    docstring); returns the lock file. Raises :class:`CheckpointError` naming the run that holds it."""
    os.makedirs(root, exist_ok=True)
    path = os.path.join(os.path.realpath(root), LOCK_NAME)
    with _held_lock:
        if path in _held:
            _held[path][1] += 1
            return path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            import fcntl
        except ImportError:  # Windows: no flock; saves into one project_dir are not guarded there
            os.close(fd)
            _held[path] = [-1, 1]
            return path
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _describe_holder(fd)
                os.close(fd)
                raise CheckpointError(
                    f"another run is saving checkpoints into {root} ({holder}): two runs saving into one "
                    "project_dir would overwrite and prune each other's checkpoints. Give this run its own "
                    "project_dir, or wait until that run has ended"
                ) from None
            os.close(fd)
            warnings.warn(
                f"cannot lock {path} ({exc.strerror}): this filesystem has no file locks, so nothing stops "
                "a second run from saving into the same project_dir",
                CheckpointWarning,
                stacklevel=4,
            )
            _held[path] = [-1, 1]
            return path
        record = (
            f"pid {os.getpid()} on host {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        _held[path] = [fd, 1]
        return path


def release_writer_lock(path: str) -> None:
    """Give back one hold of :func:`acquire_writer_lock`; the last one unlocks (closing the file does)."""
    with _held_lock:
        entry = _held.get(path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[path]
        if entry[0] >= 0:
            os.close(entry[0])
