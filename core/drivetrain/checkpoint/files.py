"""Checkpoint files on disk: written at page-cache speed, made durable and checksummed afterwards.

A save first writes its files; then a finishing step fsyncs them and checksums them for the manifest (see
:mod:`drivetrain.checkpoint.finishing`). A save with ``blocking=False`` returns once the files are written,
and the finishing step, in the background, reads them back to checksum them. A blocking save (the default)
checksums each file as it is written, on another thread while the disk-bound write goes on, and hands a
file's dirty pages to the disk every :data:`_WRITEBACK_EVERY` bytes (``sync_file_range`` on Linux, which
starts writeback without waiting), so the fsyncs at the end have little left to do.

Checksums cover consecutive :data:`HASH_CHUNK_SIZE` pieces of a file (the last one shorter; an empty file
has one, of no bytes), so the pieces of one file can be checked on several cores at once. Each piece gets
an xxh3-128 (what a load checks by default, at about 14 GB/s a core) and, only when asked for
(:data:`SHA256_CHECKSUMS`, ``ProjectConfiguration(checkpoint_sha256=True)``), a sha256, checkable with
standard tools but about ten times slower: on a machine with few cores, computing it for every byte bounded
how fast a blocking save could be (1.5 GB of sha256 is a second of a core's time).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, BinaryIO

import xxhash

#: Size of the pieces a file is checksummed in (manifest versions 2 and 3).
HASH_CHUNK_SIZE = 64 * 1024 * 1024

#: The checksums a manifest may record for each piece, by the name used in the manifest (``<name>_chunks``).
CHECKSUMS: dict[str, Callable[[], Any]] = {"sha256": hashlib.sha256, "xxh3_128": xxhash.xxh3_128}
#: What a save records by default (manifest version 3): the fast checksum a load checks.
DEFAULT_CHECKSUMS = ("xxh3_128",)
#: What a save records with ``ProjectConfiguration(checkpoint_sha256=True)``.
SHA256_CHECKSUMS = ("sha256", "xxh3_128")

_POOL: ThreadPoolExecutor | None = None

#: Read size when checksumming a file (large enough to keep syscalls cheap, small enough for caches).
_READ_SIZE = 8 * 1024 * 1024
#: Dirty pages of a file being written are handed to the disk every this many bytes.
_WRITEBACK_EVERY = 32 * 1024 * 1024


def hashing_pool() -> ThreadPoolExecutor:
    """Threads that checksum files while a load reads them (hashlib and xxhash release the GIL): one per
    core, 2 to 8. Not for work that may run during interpreter exit; see :func:`run_in_threads`."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(
            max_workers=max(2, min(8, os.cpu_count() or 1)), thread_name_prefix="drivetrain-hash"
        )
    return _POOL


def run_in_threads(tasks: Sequence[Callable[[], Any]], workers: int) -> list[Any]:
    """Run ``tasks`` on ``workers`` plain threads and return their results in order (re-raising the first
    error). Plain threads rather than an executor: a save may still be finishing while the interpreter
    exits, when executors refuse new work."""
    results: list[Any] = [None] * len(tasks)
    errors: list[BaseException] = []
    next_index = iter(range(len(tasks)))
    lock = threading.Lock()

    def work() -> None:
        while not errors:
            with lock:
                index = next(next_index, None)
            if index is None:
                return
            try:
                results[index] = tasks[index]()
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work, name="drivetrain-checksum") for _ in range(max(1, workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


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

#: Whether files being written start their writeback early. Worth it when the caller waits for the fsync
#: anyway (a blocking save); a save that returns before its fsync is slowed by it instead, as
#: ``sync_file_range`` blocks while the disk's queue is full.
_EARLY_WRITEBACK: ContextVar[bool] = ContextVar("drivetrain_early_writeback", default=True)


#: The checksums (names in :data:`CHECKSUMS`) files opened by :func:`checkpoint_writer` get as they are
#: written; none by default. Worth it when the caller waits for the save anyway (a blocking save): the
#: hashing overlaps the disk-bound write, and the finishing step need not read the files back. A save that
#: returns before it is durable leaves the checksums to the background instead, so that ``save_state``
#: returns at page-cache speed.
_INLINE_CHECKSUMS: ContextVar[tuple[str, ...]] = ContextVar("drivetrain_inline_checksums", default=())

#: Checksums of files written with inline checksums, by absolute path: (size, {"<algorithm>_chunks": [...]}).
#: :func:`drivetrain.checkpoint.manifest.write_manifest` takes them instead of reading the files back.
_written_checksums: dict[str, tuple[int, dict[str, list[str]]]] = {}
_written_checksums_lock = threading.Lock()


@contextlib.contextmanager
def blocking_save(enabled: bool, checksums: Sequence[str] = DEFAULT_CHECKSUMS) -> Iterator[None]:
    """Files opened by :func:`checkpoint_writer` inside the block start writeback early and get
    ``checksums`` as they are written only if ``enabled`` (the save waits until its checkpoint is durable)."""
    writeback = _EARLY_WRITEBACK.set(enabled)
    inline = _INLINE_CHECKSUMS.set(tuple(checksums) if enabled else ())
    try:
        yield
    finally:
        _INLINE_CHECKSUMS.reset(inline)
        _EARLY_WRITEBACK.reset(writeback)


def forget_written_checksums(directory: str) -> None:
    """Drop the checksums recorded for files under ``directory`` (a save that failed left them; the folder is
    about to be written again)."""
    prefix = os.path.join(os.path.abspath(directory), "")
    with _written_checksums_lock:
        for path in [path for path in _written_checksums if path.startswith(prefix)]:
            del _written_checksums[path]


def take_written_checksums(path: str) -> tuple[int, dict[str, list[str]]] | None:
    """The checksums recorded while ``path`` was written (once: the record is removed), or None."""
    with _written_checksums_lock:
        return _written_checksums.pop(os.path.abspath(path), None)


class _ChunkHasher:
    """The checksums named ``algorithms`` (see :data:`CHECKSUMS`) of each :data:`HASH_CHUNK_SIZE` piece of a
    file, fed its bytes in order."""

    def __init__(self, algorithms: Sequence[str]) -> None:
        self._factories = [CHECKSUMS[name] for name in algorithms]
        self.digests: dict[str, list[str]] = {f"{name}_chunks": [] for name in algorithms}
        self._hashers = [factory() for factory in self._factories]
        self._in_chunk = 0

    def update(self, view: memoryview) -> None:
        while view.nbytes:
            take = min(view.nbytes, HASH_CHUNK_SIZE - self._in_chunk)
            for hasher in self._hashers:
                hasher.update(view[:take])
            self._in_chunk += take
            view = view[take:]
            if self._in_chunk == HASH_CHUNK_SIZE:
                self._close_chunk()

    def finish(self, size: int) -> dict[str, list[str]]:
        if self._in_chunk or size == 0:  # the last, shorter piece (an empty file has one, of no bytes)
            self._close_chunk()
        return self.digests

    def _close_chunk(self) -> None:
        for digests, hasher in zip(self.digests.values(), self._hashers):
            digests.append(hasher.hexdigest())
        self._hashers = [factory() for factory in self._factories]
        self._in_chunk = 0


class CheckpointFile:
    """A binary file being written as part of a checkpoint: starts writeback of its pages as it goes. Has
    the ``write``/``flush``/``tell`` that torch.save and our writers use."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._start_writeback = _start_writeback if _EARLY_WRITEBACK.get() else None
        self._written = 0
        self._handed_to_disk = 0
        inline = _INLINE_CHECKSUMS.get()
        self.hasher = _ChunkHasher(inline) if inline else None

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.ndim != 1 or view.format not in ("B", "b", "c"):
            view = view.cast("B")
        for start in range(0, view.nbytes, _WRITEBACK_EVERY):
            self._write_all(view[start : start + _WRITEBACK_EVERY])
        return view.nbytes

    def _write_all(self, view: memoryview) -> None:
        if self.hasher is None:
            self._handle.write(view)  # a BufferedWriter writes everything or raises
        else:
            # Hash on another thread while this one writes (both release the GIL), and wait for it before
            # returning: the caller may reuse its buffer once write() returns.
            hashed = hashing_pool().submit(self.hasher.update, view)
            try:
                self._handle.write(view)
            finally:
                hashed.result()
        self._written += len(view)
        if self._start_writeback is not None and self._written - self._handed_to_disk >= _WRITEBACK_EVERY:
            # Start writing these pages to disk now (without waiting): the fsync later has little left to
            # do, and the dirty-page limit never stalls the writer.
            self._handle.flush()
            self._start_writeback(
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


@contextlib.contextmanager
def checkpoint_writer(path: str, durable: bool = False) -> Iterator[CheckpointFile]:
    """Open ``path`` for writing and close it on success. A checkpoint file is made durable later, with
    the rest of its folder (:func:`drivetrain.checkpoint.manifest.write_manifest`); ``durable`` fsyncs it
    before returning, for a file that stands alone."""
    with _written_checksums_lock:
        _written_checksums.pop(os.path.abspath(path), None)  # whatever an earlier file of this name recorded
    with open(path, "wb") as handle:
        out = CheckpointFile(handle)
        yield out
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    if out.hasher is not None:
        with _written_checksums_lock:
            _written_checksums[os.path.abspath(path)] = (out.tell(), out.hasher.finish(out.tell()))
    on_file_written(path)


def checksum_range(path: str, offset: int, length: int, algorithms: Sequence[str]) -> list[str]:
    """Hex digests (one per name in ``algorithms``, see :data:`CHECKSUMS`) of ``length`` bytes of a file
    from ``offset`` (fewer if the file ends first), read once."""
    hashers = [CHECKSUMS[name]() for name in algorithms]
    buffer = bytearray(min(_READ_SIZE, max(length, 1)))
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        handle.seek(offset)
        remaining = length
        while remaining > 0:
            count = handle.readinto(view[: min(remaining, len(buffer))])
            if not count:
                break
            for hasher in hashers:
                hasher.update(view[:count])
            remaining -= count
    return [hasher.hexdigest() for hasher in hashers]


def chunk_ranges(size: int, chunk_size: int | None = None) -> list[tuple[int, int]]:
    """(offset, length) of the pieces a file of ``size`` bytes is checksummed in."""
    chunk_size = chunk_size or HASH_CHUNK_SIZE
    return [(offset, min(chunk_size, size - offset)) for offset in range(0, size, chunk_size)] or [(0, 0)]


def sha256_chunks_of_file(path: str, chunk_size: int | None = None) -> tuple[int, list[str]]:
    """(size, sha256 of each piece) of a file already on disk, its pieces hashed in parallel."""
    size = os.path.getsize(path)
    futures = [
        hashing_pool().submit(checksum_range, path, offset, length, ("sha256",))
        for offset, length in chunk_ranges(size, chunk_size)
    ]
    return size, [future.result()[0] for future in futures]


def sha256_of_file(path: str) -> tuple[int, str]:
    """(size, sha256 hex digest) of a whole file, read in large chunks (manifest version 1 records these)."""
    size = os.path.getsize(path)
    return size, checksum_range(path, 0, size, ("sha256",))[0]


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
    """Write a single file through a temporary sibling, fsync it and rename it into place: readers see the
    old file or the whole new one, never a torn one. ``write`` receives a binary file object."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.partial")
    try:
        with checkpoint_writer(temporary, durable=True) as handle:
            write(handle)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
    fsync_path(directory)


def on_file_written(path: str) -> None:
    """Called after each checkpoint file is written and closed. A no-op; tests replace it to kill the
    process at precise moments of a save (see tests/scripts/ckpt_crash.py)."""


def on_stage(stage: str, path: str) -> None:
    """Called at each stage of finishing a checkpoint (``objects_written``, ``files_synced``,
    ``manifest_written``, then ``renamed`` for a new folder or ``committed``, ``file_moved`` (each file) and
    ``published`` for an existing one, then ``pruned``). A no-op, replaced by crash tests."""
