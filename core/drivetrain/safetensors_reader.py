"""Getting safetensors tensors into the tensors they end up in, at the speed of the disk.

A safetensors file is a JSON header followed by the raw bytes of each tensor. Two ways in, both reading
every byte during the load (nothing is left to fault in at the first forward):

* **Mapped** (CPU tensors kept in the checkpoint's dtype): the tensor is a view of a private, copy-on-write
  memory mapping of the file, and its pages are faulted in up front (``MADV_POPULATE_READ``). No copy at
  all: the tensor *is* the page-cache pages, so a warm load costs only the page tables and a cold one only
  the disk reads; host memory holds one copy of the weights (not page cache plus a private copy), and a
  write to a weight copies just that page.
* **Copied** (a dtype cast, an accelerator, a tensor the model already owns, or ``map_weights=False``):
  the destination is allocated where it belongs and the bytes are read into it with large positional reads
  (``os.preadv``), one copy from the page cache. Casts and device copies go through a small per-thread
  bounce buffer, chunk by chunk, so a cast never holds a second full copy of a tensor.

Both run on a few threads (``preadv`` and ``madvise`` release the GIL), and the next shard is announced to
the kernel (``POSIX_FADV_WILLNEED``) while the current one is read.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import json
import math
import mmap
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from drivetrain.errors import CheckpointError

#: Bytes per read: small enough to spread one large tensor over every thread, large enough that each read
#: is a long sequential request.
CHUNK_BYTES = 16 * 2**20
#: Headers larger than this are not a safetensors file (the format caps them at 100 MB).
_MAX_HEADER = 100_000_000

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}

#: Bytes per populate request of a mapping.
POPULATE_BYTES = 64 * 2**20
_PAGE = mmap.PAGESIZE
MADV_WILLNEED = 3
MADV_DONTNEED = 4
MADV_POPULATE_READ = 22  # Linux 5.14+: fault pages in (reading them from disk) without touching them

try:
    _libc_madvise = ctypes.CDLL(None, use_errno=True).madvise
    _libc_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except (OSError, AttributeError):  # pragma: no cover - not Linux/macOS
    _libc_madvise = None


def madvise(start: int, end: int, advice: int, outward: bool = False) -> int:
    """``madvise`` over the pages of bytes [start, end): the pages wholly inside, or with ``outward`` every
    page touched. Returns 0 or the errno (ENOSYS when there is no madvise)."""
    if _libc_madvise is None:
        return errno.ENOSYS
    first = start // _PAGE * _PAGE if outward else -(-start // _PAGE) * _PAGE
    last = -(-end // _PAGE) * _PAGE if outward else end // _PAGE * _PAGE
    if last <= first:
        return 0
    if _libc_madvise(first, last - first, advice) != 0:
        return ctypes.get_errno()
    return 0


#: The byte reader assumes the file's little-endian layout is the machine's.
DIRECT_READS_SUPPORTED = sys.byteorder == "little" and hasattr(os, "preadv")


class TensorRecord(NamedTuple):
    """Where one tensor's bytes are in a safetensors file (``start``/``end`` are absolute file offsets)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point


def _damaged(path: str, size: int, why: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint file {path} ({size} bytes) is damaged or truncated and cannot be read: {why}. "
        "Write or download it again"
    )


def read_header(path: str) -> dict[str, TensorRecord]:
    """The tensors of safetensors file ``path``, in the order of their bytes in the file.

    Checks what a read needs to be safe: a readable header, known dtypes, byte ranges that match the shapes
    and lie inside the file (a truncated file is caught here, before anything is read).
    """
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise _damaged(path, size, "shorter than the 8-byte header length")
            length = int.from_bytes(prefix, "little")
            if length > min(size - 8, _MAX_HEADER):
                raise _damaged(path, size, f"header of {length} bytes does not fit in the file")
            header = json.loads(handle.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _damaged(path, size, f"unreadable header ({type(exc).__name__}: {exc})") from exc
    if not isinstance(header, dict):
        raise _damaged(path, size, "the header is not a JSON object")
    base = 8 + length
    records: dict[str, TensorRecord] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            shape = tuple(int(n) for n in entry["shape"])
            begin, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _damaged(path, size, f"bad header entry for tensor {key!r}: {entry!r}") from exc
        expected = math.prod(shape) * dtype.itemsize
        if end - begin != expected or begin < 0:
            raise _damaged(
                path, size, f"tensor {key!r} spans {end - begin} bytes, its shape {shape} needs {expected}"
            )
        if base + end > size:
            raise _damaged(path, size, f"tensor {key!r} needs bytes up to {base + end}")
        records[key] = TensorRecord(dtype, shape, base + begin, base + end)
    return dict(sorted(records.items(), key=lambda item: item[1].start))


def map_file(path: str) -> mmap.mmap:
    """A private (copy-on-write) mapping of the whole file: writes to it never reach the file."""
    with open(path, "rb") as handle:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)


def can_map(record: TensorRecord) -> bool:
    """A tensor can be a view of the mapping when its bytes are aligned for its dtype (and not empty)."""
    return DIRECT_READS_SUPPORTED and record.end > record.start and record.start % record.dtype.itemsize == 0


def mapped_tensor(mapping: mmap.mmap, record: TensorRecord) -> torch.Tensor:
    """The tensor as a view of ``mapping``; its storage keeps the mapping alive."""
    count = (record.end - record.start) // record.dtype.itemsize
    return torch.frombuffer(mapping, dtype=record.dtype, count=count, offset=record.start).view(record.shape)


def map_tensor(path: str, record: TensorRecord) -> torch.Tensor:
    """One tensor of ``path`` as a view of its own private mapping (nothing is read yet: see
    :func:`populate`). The mapping lives as long as the tensor: dropping the tensor unmaps it, so its pages
    leave this process's memory (they stay in the page cache). Used for weights offloaded to disk, read at
    every forward."""
    first = record.start // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), record.end - first, offset=first, access=mmap.ACCESS_COPY)
    count = (record.end - record.start) // record.dtype.itemsize
    tensor = torch.frombuffer(mapping, dtype=record.dtype, count=count, offset=record.start - first)
    return tensor.view(record.shape)


def populate(tensor: torch.Tensor) -> None:
    """Fault in the pages of a memory-mapped CPU tensor now, in one request (reading them from disk if need
    be), instead of a page fault every few pages when it is used. Does nothing on a kernel without
    ``MADV_POPULATE_READ``: the pages then fault in when used."""
    if tensor.device.type == "cpu" and tensor.numel():
        start = tensor.data_ptr()
        madvise(start, start + tensor.numel() * tensor.element_size(), MADV_POPULATE_READ, outward=True)


class _Bounce(threading.local):
    buffer: torch.Tensor | None = None


class TensorReader:
    """Fills tensors from byte ranges of files, on a small thread pool.

    ``read`` queues a tensor; :meth:`wait` returns when every queued read of a file is done and raises the
    first failure as a CheckpointError naming the file. Use as a context manager (closes the files and
    threads).
    """

    def __init__(self, workers: int | None = None, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self.chunk_bytes = chunk_bytes
        self.pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="drivetrain-read")
        self.fds: dict[str, int] = {}
        self.pending: dict[str, list[concurrent.futures.Future]] = {}
        self.after: dict[str, list[Callable[[], None]]] = {}
        self._bounce = _Bounce()

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _fd(self, path: str) -> int:
        fd = self.fds.get(path)
        if fd is None:
            fd = self.fds[path] = os.open(path, os.O_RDONLY)
            # Sequential access: the kernel reads further ahead, in larger requests.
            _fadvise(fd, getattr(os, "POSIX_FADV_SEQUENTIAL", None))
        return fd

    def announce(self, path: str) -> None:
        """Tell the kernel ``path`` is read next, so the disk starts on it while the current file is copied."""
        _fadvise(self._fd(path), getattr(os, "POSIX_FADV_WILLNEED", None))

    def populate(self, path: str, spans: list[tuple[int, int]]) -> None:
        """Queue faulting in the mapped byte ranges ``spans`` (addresses [start, end)) of ``path``."""
        futures = self.pending.setdefault(path, [])
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1] + _PAGE:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in merged:
            for offset in range(start, end, POPULATE_BYTES):
                futures.append(
                    self.pool.submit(self._populate, path, offset, min(end, offset + POPULATE_BYTES))
                )

    def _populate(self, path: str, start: int, end: int) -> None:
        failure = madvise(start, end, MADV_POPULATE_READ, outward=True)
        if failure in (errno.EINVAL, errno.ENOSYS):
            # A kernel without MADV_POPULATE_READ: fault the pages in by reading one byte of each.
            first = start // _PAGE * _PAGE
            for address in range(max(first, start), end, _PAGE):
                ctypes.c_char.from_address(address).value  # noqa: B018 - the read is the point
            return
        if failure:
            raise CheckpointError(
                f"cannot read checkpoint file {path}: {os.strerror(failure)} while reading its pages; it was "
                "probably truncated or rewritten during the load. Write or download it again"
            )

    def read(self, path: str, record: TensorRecord, destination: torch.Tensor, name: str) -> None:
        """Queue filling ``destination`` (same shape as ``record``, any dtype and device) with the tensor."""
        if record.end == record.start:
            return
        fd = self._fd(path)
        futures = self.pending.setdefault(path, [])
        destination = destination.detach()  # written from worker threads, where autograd is on
        direct = (
            destination.device.type == "cpu"
            and destination.dtype == record.dtype
            and destination.is_contiguous()
        )
        if not direct and not destination.is_contiguous():
            # Rare (an existing, strided tensor): read into a contiguous tensor, copy once all reads are done.
            staging = torch.empty(record.shape, dtype=destination.dtype, device=destination.device)
            self.after.setdefault(path, []).append(lambda target=destination: target.copy_(staging))
            destination = staging
        if direct:
            target = destination.view(-1).view(torch.uint8)
            for offset in range(0, record.end - record.start, self.chunk_bytes):
                size = min(self.chunk_bytes, record.end - record.start - offset)
                futures.append(
                    self.pool.submit(
                        self._read_bytes,
                        fd,
                        path,
                        name,
                        target[offset : offset + size],
                        record.start + offset,
                    )
                )
            return
        flat = destination.view(-1)
        itemsize = record.dtype.itemsize
        per_chunk = max(1, self.chunk_bytes // itemsize)
        for first in range(0, flat.numel(), per_chunk):
            count = min(per_chunk, flat.numel() - first)
            futures.append(
                self.pool.submit(
                    self._read_converted,
                    fd,
                    path,
                    name,
                    flat[first : first + count],
                    record.dtype,
                    record.start + first * itemsize,
                )
            )

    def _read_bytes(self, fd: int, path: str, name: str, target: torch.Tensor, offset: int) -> None:
        view = memoryview(target.numpy())
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise CheckpointError(
                    f"checkpoint file {path} ended while reading tensor {name!r} (byte {offset + done}); it "
                    "was truncated or rewritten during the load. Write or download it again"
                )
            done += got

    def _read_converted(
        self, fd: int, path: str, name: str, target: torch.Tensor, dtype: torch.dtype, offset: int
    ) -> None:
        size = target.numel() * dtype.itemsize
        bounce = self._bounce.buffer
        if bounce is None or bounce.numel() < size:
            bounce = self._bounce.buffer = torch.empty(max(size, self.chunk_bytes), dtype=torch.uint8)
        self._read_bytes(fd, path, name, bounce[:size], offset)
        target.copy_(bounce[:size].view(dtype))

    def wait(self, path: str | None = None) -> None:
        """Wait for the reads of ``path`` (of every file when None)."""
        paths = [path] if path is not None else list(self.pending)
        for current in paths:
            futures = self.pending.pop(current, [])
            try:
                for future in futures:
                    future.result()
            except CheckpointError:
                self._cancel()
                raise
            except Exception as exc:
                self._cancel()
                raise CheckpointError(
                    f"cannot read checkpoint file {current}: {type(exc).__name__}: {exc}"
                ) from exc
            for step in self.after.pop(current, []):
                step()

    def _cancel(self) -> None:
        for futures in self.pending.values():
            for future in futures:
                future.cancel()
        concurrent.futures.wait([f for futures in self.pending.values() for f in futures])
        self.pending.clear()

    def close(self) -> None:
        self._cancel()
        self.pool.shutdown(wait=True)
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _fadvise(fd: int, advice: int | None) -> None:
    if advice is not None and hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, advice)
        except OSError:  # advice only: some filesystems refuse it
            pass
