"""What makes a checkpoint folder complete: a manifest of its files, written last, and an atomic rename.

A save writes into ``.<name>.incomplete`` beside the final folder, fsyncs every file, writes
``drivetrain_manifest.json`` (each file's size and checksums) last, fsyncs it, and renames the folder to
``<name>``. A folder without a readable manifest whose files all match it is never taken for a checkpoint.

Manifests record each file's checksums in pieces of ``chunk_size`` bytes, so the pieces verify on several
cores at once. Version 3 records ``xxh3_128_chunks`` (what a load checks by default) always and
``sha256_chunks`` only when the save asked for them; version 2 recorded ``sha256_chunks`` always and
``xxh3_128_chunks`` in its later releases. Readers ignore fields they do not know, so adding one needs no
new version; a version is added when a field that older readers rely on may be missing (as sha256 in
version 3), so that they refuse the manifest with "upgrade drivetrain" rather than misread it. Every
earlier version is still read: 2, and 1 (one whole-file ``sha256``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import threading
from concurrent.futures import Future
from typing import Any

from drivetrain.checkpoint import files
from drivetrain.checkpoint.files import (
    checkpoint_writer,
    checksum_range,
    chunk_ranges,
    fsync_path,
    hashing_pool,
)
from drivetrain.errors import CheckpointError
from drivetrain.untrusted_files import link_on_the_way, outside_folder, read_json_within

MANIFEST_NAME = "drivetrain_manifest.json"
MANIFEST_FORMAT = "drivetrain-checkpoint"
MANIFEST_VERSION = 3
_INCOMPLETE_SUFFIX = ".incomplete"

#: Bounds on what a manifest may say, so a tampered one cannot make verification exhaust memory or time: a
#: genuine manifest of a 1 TB checkpoint is about 2 MB, and drivetrain writes 64 MiB pieces.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MIN_CHUNK_SIZE = 256
MAX_CHUNK_SIZE = 1 << 40


def incomplete_path(final: str) -> str:
    """The temporary sibling a save into ``final`` writes to."""
    parent, name = os.path.split(os.path.abspath(final))
    return os.path.join(parent, f".{name}{_INCOMPLETE_SUFFIX}")


def start_incomplete(final: str) -> str:
    """Create an empty temporary folder beside ``final`` for a save into it (removing one a killed save
    left)."""
    return make_staging_folder(incomplete_path(final))


def make_staging_folder(temporary: str) -> str:
    """Create ``temporary`` empty, for a save to write its files into (removing what a killed save left)."""
    shutil.rmtree(temporary, ignore_errors=True)
    files.forget_written_checksums(temporary)
    os.makedirs(temporary)
    return temporary


def _relative_files(directory: str) -> list[str]:
    found = []
    for root, _dirs, names in os.walk(directory):
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/"))
    return sorted(found)


def _finishing_workers() -> int:
    """Threads that checksum a finished save: every core but one, which the training loop keeps (1 to 8)."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def write_manifest(
    directory: str, metadata: dict[str, Any], checksums: tuple[str, ...] = files.DEFAULT_CHECKSUMS
) -> None:
    """Make every file of ``directory`` durable, checksum it (``checksums``: names in
    :data:`files.CHECKSUMS`), and write the manifest (fsynced) as the folder's last file. The fsyncs run on
    this thread while other threads read back from the page cache the files not checksummed as they were
    written, to checksum them."""
    links = _links_inside(directory)
    if links:
        raise CheckpointError(
            f"{directory} holds symbolic links ({', '.join(links[:5])}): a checkpoint holding one could not be "
            "loaded (loads follow no link); write the files themselves into the checkpoint"
        )
    listed: dict[str, Any] = {}
    relatives = [relative for relative in _relative_files(directory) if relative != MANIFEST_NAME]
    pieces: list[tuple[str, str, int, int]] = []
    for relative in relatives:
        path = os.path.join(directory, relative)
        size = os.path.getsize(path)
        listed[relative] = {"size": size}
        written = files.take_written_checksums(path)
        wanted = [f"{algorithm}_chunks" for algorithm in checksums]
        if written is not None and written[0] == size and all(key in written[1] for key in wanted):
            listed[relative].update({key: written[1][key] for key in wanted})  # checksummed as it was written
            continue
        pieces.extend((relative, path, offset, length) for offset, length in chunk_ranges(size))
    algorithms = tuple(checksums)
    tasks = [
        functools.partial(checksum_range, path, offset, length, algorithms)
        for _, path, offset, length in pieces
    ]
    sync_errors: list[BaseException] = []

    def sync_all() -> None:
        try:
            for relative in relatives:
                fsync_path(os.path.join(directory, relative))
            for sub in {os.path.dirname(os.path.join(directory, rel)) for rel in relatives}:
                fsync_path(sub)
        except BaseException as exc:
            sync_errors.append(exc)

    syncer = threading.Thread(target=sync_all, name="drivetrain-fsync")
    syncer.start()
    try:
        digests_per_piece = files.run_in_threads(tasks, _finishing_workers())
    finally:
        syncer.join()
    if sync_errors:
        raise sync_errors[0]
    for (relative, *_), digests in zip(pieces, digests_per_piece):
        for algorithm, digest in zip(algorithms, digests):
            listed[relative].setdefault(f"{algorithm}_chunks", []).append(digest)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "chunk_size": files.HASH_CHUNK_SIZE,
        "files": dict(sorted(listed.items())),
        "metadata": metadata,
    }
    files.on_stage("files_synced", directory)
    with checkpoint_writer(os.path.join(directory, MANIFEST_NAME), durable=True) as out:
        out.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
    fsync_path(directory)
    files.on_stage("manifest_written", directory)


def read_manifest(directory: str) -> dict[str, Any]:
    """The folder's manifest, or a :class:`CheckpointError` saying why the folder is not a checkpoint."""
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.isdir(directory):
        hint = ""
        if os.path.isdir(incomplete_path(directory)):
            hint = (
                " (only an incomplete save of it exists: the process writing it stopped before it finished)"
            )
        raise CheckpointError(f"checkpoint folder {directory} does not exist{hint}")
    try:
        if os.path.islink(path):
            raise CheckpointError(f"{path} is a symbolic link: a checkpoint's files must be in its folder")
        manifest = read_json_within(path, MAX_MANIFEST_BYTES, "checkpoint manifest")
    except FileNotFoundError:
        raise CheckpointError(
            f"{directory} has no {MANIFEST_NAME}: it is an incomplete save or was not written by drivetrain. "
            "To load a folder written by another tool, pass verify_manifest=False to load_state"
        ) from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable ({exc}): the checkpoint is damaged") from exc
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != MANIFEST_FORMAT
        or not isinstance(manifest.get("files"), dict)
    ):
        raise CheckpointError(f"{path} is not a drivetrain checkpoint manifest")
    if not all(isinstance(entry, dict) for entry in manifest["files"].values()):
        raise CheckpointError(
            f"{path} lists a file without its size and checksums: the checkpoint is damaged"
        )
    if not isinstance(manifest.get("metadata", {}), dict):
        raise CheckpointError(f"{path} has metadata that is not a mapping: the checkpoint is damaged")
    version = manifest.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CheckpointError(f"{path} has an invalid version {version!r}: the checkpoint is damaged")
    if version > MANIFEST_VERSION:
        raise CheckpointError(
            f"{path} has manifest version {manifest['version']}; this drivetrain reads up to "
            f"{MANIFEST_VERSION}: upgrade drivetrain"
        )
    return manifest


def _links_inside(directory: str) -> list[str]:
    """Every symbolic link inside ``directory`` (none is followed)."""
    found = []
    for root, dirs, names in os.walk(directory):
        for name in (*dirs, *names):
            path = os.path.join(root, name)
            if os.path.islink(path):
                found.append(os.path.relpath(path, directory))
    return sorted(found)


def _links_on_the_way(directory: str, relatives: list[str]) -> list[str]:
    """The listed files, and the folders on the way to them, that are symbolic links (the folder may hold
    the user's own files and links too: only the checkpoint's are checked, and only they are read)."""
    return sorted({link for link in (link_on_the_way(directory, name) for name in relatives) if link})


def _checked_paths(directory: str, manifest: dict[str, Any]) -> dict[str, str]:
    """The manifest's files as paths, after the cheap checks: inside the folder, no symbolic link on the
    way to any of them (a link would make the load read any file the user can read), present as a regular
    file, of the recorded size."""
    for relative in manifest["files"]:
        if outside_folder(relative):
            raise CheckpointError(
                f"{directory}/{MANIFEST_NAME} lists a file outside the folder: {relative!r}"
            )
    links = _links_on_the_way(directory, list(manifest["files"]))
    if links:
        raise CheckpointError(
            f"checkpoint folder {directory} holds symbolic links ({', '.join(links[:5])}"
            f"{' ...' if len(links) > 5 else ''}): drivetrain reads only the checkpoint's own files"
        )
    paths = {}
    for relative, expected in manifest["files"].items():
        path = os.path.join(directory, relative)
        size = expected.get("size") if isinstance(expected, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise CheckpointError(f"{directory}/{MANIFEST_NAME} has no valid size for {relative!r}: {size!r}")
        try:
            status = os.lstat(path)
        except OSError:
            status = None
        if status is None or not stat.S_ISREG(status.st_mode):
            raise CheckpointError(f"checkpoint file {path} listed in the manifest is missing")
        if status.st_size != size:
            raise CheckpointError(
                f"checkpoint file {path} has {status.st_size} bytes but the manifest records {size}: "
                "it was truncated or modified after the save"
            )
        paths[relative] = path
    return paths


#: What a load checks a checkpoint's files with: ``"fast"`` (the xxh3-128 checksums, or sha256 where a
#: manifest has no others) or ``"sha256"`` (the sha256 digests, also when faster checksums are recorded).
CHECKSUM_CHOICES = ("fast", "sha256")


def _expected_pieces(
    directory: str, relative: str, expected: dict[str, Any], chunk_size: int, checksum: str
) -> tuple[str, list[str], list[tuple[int, int]]]:
    """(algorithm, expected digests, byte ranges) that check one file of a manifest."""
    size = expected["size"]
    for algorithm in ("xxh3_128", "sha256") if checksum == "fast" else ("sha256",):
        digests = expected.get(f"{algorithm}_chunks")
        if digests is None:
            continue
        pieces = max(1, -(-size // chunk_size))  # counted before any range is built
        if not isinstance(digests, list) or len(digests) != pieces:
            count = len(digests) if isinstance(digests, list) else type(digests).__name__
            raise CheckpointError(
                f"{directory}/{MANIFEST_NAME} records {count} {algorithm} pieces for {relative!r} "
                f"but a file of {size} bytes has {pieces}: the manifest is damaged"
            )
        return algorithm, digests, chunk_ranges(size, chunk_size)
    if isinstance(expected.get("sha256"), str):  # version 1: one digest of the whole file
        return "sha256", [expected["sha256"]], [(0, size)]
    if checksum == "sha256" and isinstance(expected.get("xxh3_128_chunks"), list):
        raise CheckpointError(
            f"{directory}/{MANIFEST_NAME} records no sha256 for {relative!r}: the checkpoint was saved without "
            "sha256 checksums (ProjectConfiguration(checkpoint_sha256=True) records them); check its "
            "xxh3-128 checksums instead (verify_manifest=True, checksum='fast')"
        )
    raise CheckpointError(f"{directory}/{MANIFEST_NAME} records no sha256 for {relative!r}")


def _checksum_ranges(path: str, ranges: list[tuple[int, int]], algorithm: str) -> list[str]:
    return [checksum_range(path, offset, length, (algorithm,))[0] for offset, length in ranges]


def _batches(ranges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Consecutive pieces grouped into tasks of at least :data:`files.HASH_CHUNK_SIZE` bytes: a manifest with
    tiny pieces costs one task per 64 MiB, not one per piece."""
    batches: list[list[tuple[int, int]]] = [[]]
    total = 0
    for piece in ranges:
        if total >= files.HASH_CHUNK_SIZE:
            batches.append([])
            total = 0
        batches[-1].append(piece)
        total += piece[1]
    return batches


class Verification:
    """The checksum checks of a checkpoint's files, running in the hashing threads from construction on;
    :meth:`wait` raises :class:`CheckpointError` naming the first file that does not match."""

    def __init__(
        self, directory: str, manifest: dict[str, Any], paths: dict[str, str], checksum: str = "fast"
    ) -> None:
        if checksum not in CHECKSUM_CHOICES:
            raise ValueError(
                f"checkpoint verification {checksum!r} is not one of {', '.join(map(repr, CHECKSUM_CHOICES))}"
            )
        self.manifest = manifest
        chunk_size = manifest.get("chunk_size", files.HASH_CHUNK_SIZE)
        if (
            not isinstance(chunk_size, int)
            or isinstance(chunk_size, bool)
            or not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE
        ):
            raise CheckpointError(
                f"{directory}/{MANIFEST_NAME} has an invalid chunk_size {chunk_size!r} (valid: a whole number "
                f"of bytes from {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE})"
            )
        pool = hashing_pool()
        self._checks: list[tuple[str, str, list[str], list[Future]]] = []
        for relative, path in paths.items():
            algorithm, digests, ranges = _expected_pieces(
                directory, relative, manifest["files"][relative], chunk_size, checksum
            )
            futures = [pool.submit(_checksum_ranges, path, batch, algorithm) for batch in _batches(ranges)]
            self._checks.append((path, algorithm, digests, futures))
        self._outcome: CheckpointError | None = None
        self._done = False

    def wait(self) -> dict[str, Any]:
        """Wait for every check; returns the manifest or raises (every time it is called) on a mismatch."""
        if not self._done:
            self._done = True
            for path, algorithm, expected, futures in self._checks:
                try:
                    digests = [digest for future in futures for digest in future.result()]
                except OSError as exc:
                    self._outcome = CheckpointError(
                        f"checkpoint file {path} could not be read while verifying it ({exc.strerror or exc}): "
                        "it was removed or replaced during the load (another run pruning old checkpoints?)"
                    )
                    break
                if digests != expected:
                    self._outcome = CheckpointError(
                        f"checkpoint file {path} does not match its {algorithm} checksum in the manifest: "
                        "it was modified or corrupted after the save"
                    )
                    break
            if self._outcome is not None:
                for *_, futures in self._checks:
                    for future in futures:
                        future.cancel()
        if self._outcome is not None:
            raise self._outcome
        return self.manifest


def start_verification(directory: str, checksum: str = "fast") -> Verification:
    """Read the manifest, check names and sizes now (raising :class:`CheckpointError`), and start
    checksumming every file in the background: ``.wait()`` on the result before using what was read."""
    manifest = read_manifest(directory)
    return Verification(directory, manifest, _checked_paths(directory, manifest), checksum)


def verify(directory: str, check_hashes: bool = True, checksum: str = "fast") -> dict[str, Any]:
    """Check every file the manifest lists: present, of the recorded size and (``check_hashes``) checksums
    (``checksum``: see :data:`CHECKSUM_CHOICES`). Returns the manifest; raises :class:`CheckpointError`
    naming the first file that does not match."""
    if not check_hashes:
        manifest = read_manifest(directory)
        _checked_paths(directory, manifest)
        return manifest
    return start_verification(directory, checksum).wait()


def checkpoint_path(folder: str, name: str) -> str | None:
    """The path of ``name`` (a file, or a subfolder holding files) in the checkpoint ``folder`` if the
    checkpoint holds it, else None. When the folder has a manifest only what it lists counts: a file beside
    them that it does not list (the user's, or planted) is no part of the checkpoint and is never read.
    Without a manifest (``verify_manifest=False``), whatever is there counts."""
    path = os.path.join(folder, name)
    listed = _listed_names(folder)
    if listed is None:
        return path if os.path.exists(path) else None
    if name in listed or any(entry.startswith(f"{name}/") for entry in listed):
        return path
    return None


def _listed_names(folder: str) -> frozenset[str] | None:
    """The names the folder's manifest lists (None without one), read again only when it changed."""
    try:
        status = os.stat(os.path.join(folder, MANIFEST_NAME))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"cannot read {os.path.join(folder, MANIFEST_NAME)}: {exc}") from exc
    return _listed_names_of(os.path.abspath(folder), status.st_ino, status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _listed_names_of(folder: str, inode: int, size: int, mtime_ns: int) -> frozenset[str]:
    return frozenset(read_manifest(folder)["files"])


def is_complete(directory: str) -> bool:
    """A cheap test (manifest present, files present with their sizes) used to pick checkpoints; loading
    still verifies the hashes."""
    try:
        verify(directory, check_hashes=False)
    except CheckpointError:
        return False
    return True
