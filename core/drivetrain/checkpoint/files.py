"""Durable file writing: every byte of a checkpoint reaches the disk before anyone may call it complete.

Files are hashed while they are written (no second read) and fsynced before the manifest that vouches for
them is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

#: Size and sha256 of each file written through :func:`durable_writer`, by folder then file name, so a
#: manifest does not read back what was just hashed on the way out.
_RECORDS: dict[str, dict[str, dict[str, Any]]] = {}

#: Read size when hashing a file that already exists (large enough to keep syscalls cheap).
_CHUNK = 8 * 1024 * 1024


class HashingWriter:
    """A binary file object that feeds every byte it writes to a sha256 and counts them.

    ``torch.save`` and our safetensors writer call ``write`` directly, so the checksum costs no extra read.
    """

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._sha.update(view)
        written = self._handle.write(view)
        self.size += len(view)
        return written if written is not None else len(view)

    def flush(self) -> None:
        self._handle.flush()

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        # torch.save checks this to decide whether it may seek back; it must not (the hash would be wrong).
        return False

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


@contextlib.contextmanager
def durable_writer(path: str) -> Iterator[HashingWriter]:
    """Open ``path`` for writing; on success flush, fsync, and remember its size and sha256 (see
    :func:`take_records`) so the manifest need not read it again."""
    with open(path, "wb") as handle:
        writer = HashingWriter(handle)
        yield writer
        handle.flush()
        os.fsync(handle.fileno())
    folder, name = os.path.split(os.path.abspath(path))
    _RECORDS.setdefault(folder, {})[name] = {"size": writer.size, "sha256": writer.hexdigest()}
    on_file_written(path)


def take_records(directory: str) -> dict[str, dict[str, Any]]:
    """Size and sha256 of the files this process wrote directly into ``directory`` (and forget them)."""
    return _RECORDS.pop(os.path.abspath(directory), {})


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
        with durable_writer(temporary) as handle:
            write(handle)
        _RECORDS.get(directory, {}).pop(os.path.basename(temporary), None)
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
