"""Automatic checkpoints (``project_dir/checkpoints/checkpoint_<n>``): picking the complete ones,
pruning the oldest."""

from __future__ import annotations

import contextlib
import os
import re
import shutil

from drivetrain.checkpoint import files
from drivetrain.checkpoint.manifest import (
    MANIFEST_NAME,
    incomplete_path,
    is_complete,
    read_manifest,
)
from drivetrain.checkpoint.publishing import recover
from drivetrain.errors import CheckpointError

_CHECKPOINT_FOLDER = re.compile(r"^checkpoint_(\d+)$")
_INCOMPLETE_SUFFIX = ".incomplete"
_REPLACED_SUFFIX = ".replaced"


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
            recover(path)
            found.append((number, path))
    return [path for _, path in sorted(found)]


def complete_checkpoints(root: str) -> list[str]:
    """The complete ``checkpoint_<n>`` folders under ``root`` (manifest readable, files present with their
    sizes), oldest first."""
    return [path for path in _numbered_folders(root) if is_complete(path)]


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
