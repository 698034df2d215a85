"""Durable file writing: every byte of a checkpoint reaches the disk before anyone may call it complete.

A checkpoint file is hashed from the very bytes being written (on a helper thread, while this thread hands
the same buffer to the kernel), so nothing is read back to build the manifest. Its pages are pushed to the
disk while it is written (``sync_file_range`` on Linux), so the final fsync only waits for the last few
megabytes instead of the whole file, and that fsync runs in a background thread while the next file is
written. The manifest is written only after every fsync returned.

Hashes are sha256 of consecutive :data:`HASH_CHUNK_SIZE` pieces of a file (the last one shorter; an empty
file has one, of no bytes): the pieces of one file can be verified on several cores at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

#: Size of the pieces a file is hashed in (manifest version 2).
HASH_CHUNK_SIZE = 64 * 1024 * 1024

#: Records of the files written through :func:`durable_writer` (futures: fsync in progress), by folder then
#: file name.
_RECORDS: dict[str, dict[str, Future]] = {}
_POOL: ThreadPoolExecutor | None = None
_SYNC: ThreadPoolExecutor | None = None

#: Read size when hashing a file from disk (large enough to keep syscalls cheap, small enough for caches).
_READ_SIZE = 8 * 1024 * 1024
#: Writes at least this large are hashed on a helper thread while this thread writes them.
_PARALLEL_HASH_MIN = 1024 * 1024
#: Dirty pages of a file being written are handed to the disk every this many bytes.
_WRITEBACK_EVERY = 32 * 1024 * 1024


def hashing_pool() -> ThreadPoolExecutor:
    """Threads that hash (hashlib releases the GIL on large buffers): one per core, 2 to 8."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(
            max_workers=max(2, min(8, os.cpu_count() or 1)), thread_name_prefix="drivetrain-hash"
        )
    return _POOL


def _find_sync_file_range() -> Callable[[int, int, int], Any] | None:
    """``sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE)`` from libc, or None off Linux. Python
    has no binding; it starts writeback of a range without waiting for it, which fsync alone cannot do."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    function.restype = ctypes.c_int
    write_flag = 2  # SYNC_FILE_RANGE_WRITE

    def start(fd: int, offset: int, nbytes: int) -> Any:
        return function(fd, offset, nbytes, write_flag)

    return start


_start_writeback = _find_sync_file_range()


class ChunkHasher:
    """sha256 of consecutive ``chunk_size`` pieces of a byte stream fed in order through :meth:`update`."""

    def __init__(self, chunk_size: int | None = None) -> None:
        self.chunk_size = chunk_size or HASH_CHUNK_SIZE
        self.size = 0
        self._digests: list[str] = []
        self._current = hashlib.sha256()
        self._filled = 0

    def update(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        position = 0
        while position < len(view):
            take = min(len(view) - position, self.chunk_size - self._filled)
            self._current.update(view[position : position + take])
            position += take
            self._filled += take
            if self._filled == self.chunk_size:
                self._digests.append(self._current.hexdigest())
                self._current = hashlib.sha256()
                self._filled = 0
        self.size += len(view)

    def digests(self) -> list[str]:
        """The pieces' hex digests (call once, after the last update)."""
        if self._filled or not self._digests:
            self._digests.append(self._current.hexdigest())
            self._filled = 0
        return self._digests


class DurableFile:
    """A binary file being written as part of a checkpoint: hashes what it writes (in chunks) and starts
    writeback as it goes. Has the ``write``/``flush``/``tell`` that torch.save and our writers use."""

    def __init__(self, handle: BinaryIO, hashed: bool) -> None:
        self._handle = handle
        self.hashed = hashed
        self._hasher = ChunkHasher() if hashed else None
        self._written = 0
        self._handed_to_disk = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.ndim != 1 or view.format not in ("B", "b", "c"):
            view = view.cast("B")
        length = view.nbytes
        if self._hasher is None or length < _PARALLEL_HASH_MIN:
            if self._hasher is not None:
                self._hasher.update(view)
            self._write_all(view)
            return length
        # The helper thread hashes the buffer while this one copies it into the page cache; both only read
        # it, and the call returns only when both are done (the caller may reuse the buffer afterwards).
        hashing = hashing_pool().submit(self._hasher.update, view)
        try:
            for start in range(0, length, _WRITEBACK_EVERY):
                self._write_all(view[start : start + _WRITEBACK_EVERY])
        finally:
            hashing.result()
        return length

    def _write_all(self, view: memoryview) -> None:
        self._handle.write(view)  # a BufferedWriter writes everything or raises
        self._written += len(view)
        if _start_writeback is not None and self._written - self._handed_to_disk >= _WRITEBACK_EVERY:
            # Start writing these pages to disk now (without waiting): the fsync at the end then has little
            # left to do, and the dirty-page limit never stalls the writer.
            self._handle.flush()
            _start_writeback(
                self._handle.fileno(), self._handed_to_disk, self._written - self._handed_to_disk
            )
            self._handed_to_disk = self._written

    def flush(self) -> None:
        self._handle.flush()

    def tell(self) -> int:
        return self._written

    def fileno(self) -> int:
        return self._handle.fileno()

    def writable(self) -> bool:
        return True

    def record(self) -> dict[str, Any]:
        """``{"size", "sha256_chunks"}`` of what was written (hashed files only)."""
        assert self._hasher is not None
        return {"size": self._written, "sha256_chunks": self._hasher.digests()}


def _syncing_thread() -> ThreadPoolExecutor:
    """One thread that fsyncs finished checkpoint files while the next one is being written."""
    global _SYNC
    if _SYNC is None:
        _SYNC = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drivetrain-fsync")
    return _SYNC


def _finish(handle: BinaryIO, out: DurableFile, path: str) -> dict[str, Any] | None:
    try:
        os.fsync(handle.fileno())
    finally:
        handle.close()
    on_file_written(path)
    return out.record() if out.hashed else None


@contextlib.contextmanager
def durable_writer(path: str, hashed: bool = True) -> Iterator[DurableFile]:
    """Open ``path`` for writing; on success flush and fsync it.

    ``hashed`` (a checkpoint file): the fsync runs in a background thread while the caller writes the next
    file, and the file's size and chunk hashes are kept for the manifest; :func:`take_records` waits for
    both. Otherwise the fsync is done before returning."""
    handle = open(path, "wb")  # closed below on failure, else by the fsync thread
    try:
        out = DurableFile(handle, hashed)
        yield out
        handle.flush()
    except BaseException:
        handle.close()
        raise
    if not hashed:
        _finish(handle, out, path)
        return
    folder, name = os.path.split(os.path.abspath(path))
    _RECORDS.setdefault(folder, {})[name] = _syncing_thread().submit(_finish, handle, out, path)


def take_records(directory: str) -> dict[str, dict[str, Any]]:
    """``{file name: {"size", "sha256_chunks"}}`` of the files this process wrote directly into
    ``directory`` through :func:`durable_writer`, once each is on disk; and forget them. Raises the first
    error a background fsync met."""
    pending = _RECORDS.pop(os.path.abspath(directory), {})
    records: dict[str, dict[str, Any]] = {}
    failure: BaseException | None = None
    for name, future in pending.items():
        try:
            records[name] = future.result()
        except BaseException as exc:  # wait for every fsync before reporting
            failure = failure or exc
    if failure is not None:
        raise failure
    return records


def hash_range(path: str, offset: int, length: int) -> str:
    """sha256 hex digest of ``length`` bytes of a file from ``offset`` (fewer if the file ends first)."""
    sha = hashlib.sha256()
    buffer = bytearray(min(_READ_SIZE, max(length, 1)))
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        handle.seek(offset)
        remaining = length
        while remaining > 0:
            count = handle.readinto(view[: min(remaining, len(buffer))])
            if not count:
                break
            sha.update(view[:count])
            remaining -= count
    return sha.hexdigest()


def chunk_ranges(size: int, chunk_size: int | None = None) -> list[tuple[int, int]]:
    """(offset, length) of the pieces a file of ``size`` bytes is hashed in."""
    chunk_size = chunk_size or HASH_CHUNK_SIZE
    return [(offset, min(chunk_size, size - offset)) for offset in range(0, size, chunk_size)] or [(0, 0)]


def sha256_chunks_of_file(path: str, chunk_size: int | None = None) -> tuple[int, list[str]]:
    """(size, chunk digests) of a file already on disk, its pieces hashed in parallel."""
    size = os.path.getsize(path)
    futures = [
        hashing_pool().submit(hash_range, path, offset, length)
        for offset, length in chunk_ranges(size, chunk_size)
    ]
    return size, [future.result() for future in futures]


def sha256_of_file(path: str) -> tuple[int, str]:
    """(size, sha256 hex digest) of a whole file, read in large chunks (manifest version 1 records these)."""
    size = os.path.getsize(path)
    return size, hash_range(path, 0, size)


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
