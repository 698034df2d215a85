"""What makes a checkpoint folder complete: a manifest of its files, written last, and an atomic rename.

A save writes into ``.<name>.incomplete`` beside the final folder, fsyncs every file, writes
``drivetrain_manifest.json`` (each file's size and sha256) last, fsyncs it, and renames the folder to
``<name>``. A folder without a readable manifest whose files all match it is never taken for a checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from typing import Any

from drivetrain.checkpoint import files
from drivetrain.checkpoint.files import durable_writer, fsync_path, hashing_pool, sha256_of_file
from drivetrain.errors import CheckpointError

MANIFEST_NAME = "drivetrain_manifest.json"
MANIFEST_FORMAT = "drivetrain-checkpoint"
MANIFEST_VERSION = 1
_INCOMPLETE_SUFFIX = ".incomplete"
_REPLACED_SUFFIX = ".replaced"
_CHECKPOINT_FOLDER = re.compile(r"^checkpoint_(\d+)$")


def incomplete_path(final: str) -> str:
    """The temporary sibling a save into ``final`` writes to."""
    parent, name = os.path.split(os.path.abspath(final))
    return os.path.join(parent, f".{name}{_INCOMPLETE_SUFFIX}")


def _replaced_path(final: str) -> str:
    parent, name = os.path.split(os.path.abspath(final))
    return os.path.join(parent, f".{name}{_REPLACED_SUFFIX}")


def start_incomplete(final: str) -> str:
    """Create an empty temporary folder for a save into ``final`` (removing one a killed save left)."""
    temporary = incomplete_path(final)
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    return temporary


def _relative_files(directory: str) -> list[str]:
    found = []
    for root, _dirs, names in os.walk(directory):
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/"))
    return sorted(found)


def write_manifest(directory: str, records: dict[str, dict[str, Any]], metadata: dict[str, Any]) -> None:
    """List every file of ``directory`` with its size and sha256 (taken from ``records`` when the writer
    hashed it already, else read now) and write the manifest, fsynced, as the folder's last file."""
    listed: dict[str, Any] = {}
    for relative in _relative_files(directory):
        if relative == MANIFEST_NAME:
            continue
        path = os.path.join(directory, relative)
        known = records.get(relative)
        if known is None or known["size"] != os.path.getsize(path):
            fsync_path(path)  # written by a library that did not fsync (or by a pre-save hook)
            known = hashing_pool().submit(sha256_of_file, path)
        listed[relative] = known
    for relative, known in listed.items():
        if not isinstance(known, dict):
            size, digest = known.result()
            listed[relative] = {"size": size, "sha256": digest}
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "files": listed, "metadata": metadata}
    for sub in {os.path.dirname(os.path.join(directory, rel)) for rel in listed}:
        fsync_path(sub)
    files.on_stage("files_synced", directory)
    with durable_writer(os.path.join(directory, MANIFEST_NAME)) as out:
        out.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
    fsync_path(directory)
    files.on_stage("manifest_written", directory)


def seal(temporary: str, final: str) -> None:
    """Rename the finished temporary folder to ``final``. An existing ``final`` is moved aside first and
    deleted after; a crash between the two renames is repaired by :func:`recover`."""
    final = os.path.abspath(final)
    replaced = _replaced_path(final)
    if os.path.lexists(final):
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
    os.rename(temporary, final)
    fsync_path(os.path.dirname(final))
    files.on_stage("renamed", final)
    shutil.rmtree(replaced, ignore_errors=True)


def recover(final: str) -> None:
    """Undo a save that died between moving the old ``final`` aside and renaming the new one in."""
    replaced = _replaced_path(final)
    if not os.path.lexists(final) and os.path.isdir(replaced) and is_complete(replaced):
        os.rename(replaced, final)


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
        with open(path, "rb") as handle:
            manifest = json.loads(handle.read())
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
    if manifest.get("version", 0) > MANIFEST_VERSION:
        raise CheckpointError(
            f"{path} has manifest version {manifest['version']}; this drivetrain reads up to "
            f"{MANIFEST_VERSION}: upgrade drivetrain"
        )
    return manifest


def verify(directory: str, check_hashes: bool = True) -> dict[str, Any]:
    """Check every file the manifest lists: present, of the recorded size and (``check_hashes``) sha256.
    Returns the manifest; raises :class:`CheckpointError` naming the first file that does not match."""
    manifest = read_manifest(directory)
    paths = {}
    for relative, expected in manifest["files"].items():
        path = os.path.join(directory, relative)
        if os.path.isabs(relative) or ".." in relative.split("/"):
            raise CheckpointError(
                f"{directory}/{MANIFEST_NAME} lists a file outside the folder: {relative!r}"
            )
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint file {path} listed in the manifest is missing")
        size = os.path.getsize(path)
        if size != expected["size"]:
            raise CheckpointError(
                f"checkpoint file {path} has {size} bytes but the manifest records {expected['size']}: "
                "it was truncated or modified after the save"
            )
        paths[relative] = path
    if check_hashes:
        digests = {rel: hashing_pool().submit(sha256_of_file, path) for rel, path in paths.items()}
        for relative, future in digests.items():
            if future.result()[1] != manifest["files"][relative]["sha256"]:
                raise CheckpointError(
                    f"checkpoint file {paths[relative]} does not match its sha256 in the manifest: it was "
                    "modified or corrupted after the save"
                )
    return manifest


def is_complete(directory: str) -> bool:
    """A cheap test (manifest present, files present with their sizes) used to pick checkpoints; loading
    still verifies the hashes."""
    try:
        verify(directory, check_hashes=False)
    except CheckpointError:
        return False
    return True


def checkpoint_number(path: str) -> int | None:
    """``n`` for a folder named ``checkpoint_<n>``, else None."""
    match = _CHECKPOINT_FOLDER.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def complete_checkpoints(root: str) -> list[str]:
    """The complete ``checkpoint_<n>`` folders under ``root``, oldest (smallest n) first."""
    if not os.path.isdir(root):
        return []
    for name in os.listdir(root):
        if name.startswith(".checkpoint_") and name.endswith(_REPLACED_SUFFIX):
            recover(os.path.join(root, name[1 : -len(_REPLACED_SUFFIX)]))
    found = []
    for name in os.listdir(root):
        number = checkpoint_number(name)
        path = os.path.join(root, name)
        if number is not None and os.path.isdir(path) and is_complete(path):
            found.append((number, path))
    return [path for _, path in sorted(found)]


def prune(root: str, total_limit: int, keep: str) -> list[str]:
    """Delete the oldest complete checkpoints under ``root`` so at most ``total_limit`` remain, never
    ``keep`` (the one just written), and the leftovers of killed saves. Folders without a manifest that are
    not our temporaries are left alone: they may be someone else's. Returns the deleted paths."""
    deleted = []
    complete = [path for path in complete_checkpoints(root) if os.path.abspath(path) != os.path.abspath(keep)]
    excess = len(complete) + 1 - total_limit
    for path in complete[: max(excess, 0)]:
        # Rename first (atomic), so a crash mid-delete leaves a temporary, never a half-deleted checkpoint.
        doomed = incomplete_path(path)
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(path, doomed)
        shutil.rmtree(doomed)
        deleted.append(path)
    for name in os.listdir(root):
        if name.startswith(".checkpoint_") and name.endswith(_INCOMPLETE_SUFFIX):
            with contextlib.suppress(OSError):
                shutil.rmtree(os.path.join(root, name))
    files.on_stage("pruned", root)
    return deleted
