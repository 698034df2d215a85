"""Durable file writing: every byte of a checkpoint reaches the disk before anyone may call it complete.

Files are fsynced, and hashed in background threads, before the manifest that vouches for them is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

#: Hashes of the files written through :func:`durable_writer`, by folder then file name: computed in
#: background threads (re-reading the fresh file from the page cache) while the next file is written, so a
#: save costs about max(write, hash) rather than their sum, and several files hash on several cores.
_RECORDS: dict[str, dict[str, Future]] = {}
_POOL: ThreadPoolExecutor | None = None

#: Read size when hashing a file (large enough to keep syscalls cheap).
_CHUNK = 8 * 1024 * 1024


def hashing_pool() -> ThreadPoolExecutor:
    """Threads that hash files (hashlib releases the GIL on large buffers)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(
            max_workers=max(2, min(4, os.cpu_count() or 1)), thread_name_prefix="drivetrain-hash"
        )
    return _POOL


@contextlib.contextmanager
def durable_writer(path: str, hashed: bool = True) -> Iterator[BinaryIO]:
    """Open ``path`` for writing; on success flush and fsync it, and (``hashed``: a checkpoint file) start
    hashing it in the background (see :func:`take_records`) so the manifest need not hash each in turn."""
    with open(path, "wb") as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
    if hashed:
        folder, name = os.path.split(os.path.abspath(path))
        _RECORDS.setdefault(folder, {})[name] = hashing_pool().submit(sha256_of_file, path)
    on_file_written(path)


def take_records(directory: str) -> dict[str, dict[str, Any]]:
    """``{file name: {"size", "sha256"}}`` of the files this process wrote directly into ``directory``
    (waiting for their hashes), and forget them."""
    pending = _RECORDS.pop(os.path.abspath(directory), {})
    records = {}
    for name, future in pending.items():
        size, digest = future.result()
        records[name] = {"size": size, "sha256": digest}
    return records


def sha256_of_file(path: str) -> tuple[int, str]:
    """(size, sha256 hex digest) of a file, read in large chunks."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        while True:
            count = handle.readinto(buffer)
            if not count:
                break
            sha.update(view[:count])
            size += count
    return size, sha.hexdigest()


def fsync_path(path: str) -> None:
    """fsync a file or a directory (a directory's fsync makes the names in it durable)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else os.O_RDONLY
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError:
        # Some filesystems (and Windows for directories) refuse fsync on a directory; nothing better to do.
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, write: Any) -> None:
    """Write a single file through a temporary sibling and rename it into place: readers see the old file or
    the whole new one, never a torn one. ``write`` receives a binary file object."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.partial")
    try:
        with durable_writer(temporary, hashed=False) as handle:
            write(handle)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
    fsync_path(directory)


def on_file_written(path: str) -> None:
    """Called after each checkpoint file is durable. A no-op; tests replace it to kill the process at
    precise moments of a save (see tests/scripts/ckpt_crash.py)."""


def on_stage(stage: str, path: str) -> None:
    """Called at each stage of sealing a checkpoint (``objects_written``, ``files_synced``,
    ``manifest_written``, ``renamed``, ``pruned``). A no-op, replaced by crash tests."""
