"""How a finished save takes its place: all at once, in a folder that may hold the user's own files.

A save into a folder that does not exist yet is staged in ``.<name>.incomplete`` beside it and renamed to
``<name>``: one atomic step publishes the whole checkpoint.

A save into a folder that exists (an ``output_dir`` holding other things, ``"."``, the last checkpoint of a
``save_state("checkpoints/last")`` loop) writes and replaces only the files the checkpoint consists of, under
Accelerate's names, and leaves every other file and subfolder alone. Files with fixed names inside a folder
cannot be swapped as a set by one rename, so the save goes through a commit record:

1. the files are staged in ``<folder>/.drivetrain-save.incomplete`` and made durable, the manifest last;
2. the staging folder is renamed to ``<folder>/.drivetrain-save.committed``: this rename is the commit;
3. the folder's old manifest is moved into the commit record (the folder stops being a complete
   checkpoint), each new file is renamed into place, files of the previous checkpoint that the new one does
   not have are removed, and the new manifest is moved in last;
4. the commit record is removed.

A save killed before step 2 leaves the previous checkpoint as it was (its staging folder is removed by the
next save into the folder). A save killed after it is finished by :func:`roll_forward`, which every load of
the folder and every save into it runs first: a reader going through drivetrain sees the previous
checkpoint or the new one, never a mix. Every step of :func:`roll_forward` can be repeated.

Deleting a large file is not free (on a filesystem mounted with ``discard`` it costs about a second per GB),
so the previous checkpoint's files are not deleted while the save waits: step 3 renames each of them into
``.<name>.drivetrain-trash-<pid>-<n>`` beside the folder (on the same filesystem; inside the commit record
when the folder's parent is another filesystem or not writable), which a background thread then deletes.
A process killed before that leaves the trash folder, which the next save or load of the folder removes.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import stat
import threading
from collections.abc import Iterable

from drivetrain.checkpoint import files
from drivetrain.checkpoint.files import fsync_path
from drivetrain.checkpoint.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    is_complete,
    make_staging_folder,
    start_incomplete,
)
from drivetrain.errors import CheckpointError
from drivetrain.untrusted_files import link_on_the_way, outside_folder, read_json_within

#: Inside an existing folder: the save being staged, and its commit record once complete.
STAGING_NAME = ".drivetrain-save.incomplete"
COMMITTED_NAME = ".drivetrain-save.committed"
#: Inside the commit record: the manifest the folder held before (the files a roll forward may remove).
PREVIOUS_MANIFEST_NAME = "previous_manifest.json"
_REPLACED_SUFFIX = ".replaced"


def committed_path(final: str) -> str:
    return os.path.join(final, COMMITTED_NAME)


_TRASH_MARK = ".drivetrain-trash-"
#: Trash folders this process is deleting in the background.
_discarding: set[str] = set()
_discarding_lock = threading.Lock()
_trash_numbers = itertools.count()


def _trash_folder(final: str) -> str:
    """Where a roll forward of a save into ``final`` puts the files it replaces: beside ``final`` when its
    parent is writable and on the same filesystem, else inside the commit record (removed with it)."""
    parent, name = os.path.split(final)
    trash = os.path.join(parent, f".{name}{_TRASH_MARK}{os.getpid()}-{next(_trash_numbers)}")
    try:
        if os.stat(parent).st_dev == os.stat(final).st_dev and os.access(parent, os.W_OK):
            os.makedirs(trash)
            return trash
    except OSError:
        pass
    return os.path.join(committed_path(final), "previous")


def _discard_later(trash: str) -> None:
    """Delete ``trash`` on a background thread (not a daemon: the interpreter waits for it at exit)."""

    def discard() -> None:
        shutil.rmtree(trash, ignore_errors=True)
        with _discarding_lock:
            _discarding.discard(trash)

    with _discarding_lock:
        _discarding.add(trash)
    threading.Thread(target=discard, name="drivetrain-discard", daemon=False).start()


def wait_for_discards() -> None:
    """Wait until the previous checkpoints' files that saves replaced are deleted (tests, benchmarks)."""
    for thread in threading.enumerate():
        if thread.name == "drivetrain-discard":
            thread.join()


def _remove_left_trash(final: str) -> None:
    """Remove the trash folders of ``final`` that a killed process left (not those being deleted here)."""
    parent, name = os.path.split(final)
    prefix = f".{name}{_TRASH_MARK}"
    try:
        names = [entry for entry in os.listdir(parent) if entry.startswith(prefix)]
    except OSError:
        return
    with _discarding_lock:
        busy = set(_discarding)
    for entry in names:
        path = os.path.join(parent, entry)
        if path not in busy and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def start_staging(final: str) -> str:
    """Create the empty folder a save into ``final`` writes its files to, and return it: beside ``final``
    when it does not exist, inside it when it does (after finishing a save into it that was interrupted
    after its commit, and removing one that was interrupted before)."""
    final = os.path.abspath(final)
    if os.path.lexists(final) and not os.path.isdir(final):
        raise CheckpointError(f"cannot save a checkpoint into {final}: it is a file, not a folder")
    if not os.path.isdir(final):
        return start_incomplete(final)
    recover(final)
    return make_staging_folder(os.path.join(final, STAGING_NAME))


def publish(staging: str, final: str, replace: bool = True) -> None:
    """Put the complete checkpoint staged in ``staging`` (manifest written) in place as ``final``.

    Staged beside ``final``, it is renamed to ``final``; if ``final`` has appeared meanwhile, the staged
    folder becomes its commit record instead (``replace``) or the save is refused (automatic naming: a
    ``checkpoint_<n>`` is never merged into another run's). Staged inside ``final``, it is committed and
    rolled forward (see the module docstring). A failure before the commit removes ``staging``; after it,
    the next save or load of ``final`` completes the save."""
    final = os.path.abspath(final)
    committed = committed_path(final)
    try:
        if os.path.dirname(os.path.abspath(staging)) != final:
            try:
                os.rename(staging, final)  # onto nothing, or an empty folder: atomic, nothing is lost
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                    raise
                if not replace:
                    raise CheckpointError(
                        f"{final} appeared while this checkpoint was being saved (another run saving into "
                        "the same project_dir?); it was left as it is and this checkpoint was not written"
                    ) from None
            else:
                fsync_path(os.path.dirname(final))
                files.on_stage("renamed", final)
                return
        _check_places(staging, final)
        os.rename(staging, committed)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_path(final)
    files.on_stage("committed", final)
    trash = _trash_folder(final)
    try:
        roll_forward(final, trash)
    except OSError as exc:
        raise CheckpointError(
            f"the checkpoint saved into {final} is committed but its files could not all be put in place "
            f"({type(exc).__name__}: {exc}); the next save_state or load_state of {final} finishes it"
        ) from exc
    if not trash.startswith(committed):
        _discard_later(trash)


def _check_places(staging: str, final: str) -> None:
    """Before committing into the existing folder ``final``: every staged file can take its place there
    (no folder of its name, no file or link where the checkpoint has a subfolder), so that putting the
    files in place after the commit cannot stop half way."""
    for folder, _dirs, names in os.walk(staging):
        for name in names:
            relative = os.path.relpath(os.path.join(folder, name), staging).replace(os.sep, "/")
            link = link_on_the_way(final, relative)
            if link is not None and link != relative:
                raise CheckpointError(
                    f"cannot save into {final}: {link} is a symbolic link where the checkpoint has a folder; "
                    "a checkpoint's files are written in its folder"
                )
            parts = relative.split("/")
            for count in range(1, len(parts)):
                path = os.path.join(final, *parts[:count])
                if os.path.lexists(path) and not os.path.isdir(path):
                    raise CheckpointError(
                        f"cannot save into {final}: {path} is a file where the checkpoint has a folder"
                    )
            target = os.path.join(final, relative)
            if os.path.isdir(target) and not os.path.islink(target):
                raise CheckpointError(
                    f"cannot save into {final}: the checkpoint file {relative} would replace a folder of that "
                    "name, which is kept; move it away and save again"
                )


def _listed_files(manifest_path: str) -> list[str]:
    """The file names a manifest lists, keeping only names inside the folder ([] when it is unreadable:
    a damaged old manifest only means its files are not removed)."""
    try:
        listed = read_json_within(manifest_path, MAX_MANIFEST_BYTES, "checkpoint manifest")["files"]
    except (OSError, CheckpointError, KeyError, TypeError):
        return []
    if not isinstance(listed, dict):
        return []
    return [name for name in listed if isinstance(name, str) and not outside_folder(name)]


def roll_forward(final: str, trash: str | None = None) -> bool:
    """Finish a save into the existing folder ``final`` that was interrupted after its commit; returns
    whether there was one. Each step can be repeated, so an interruption of this function is finished by
    the next call. The files it replaces or removes are moved into ``trash`` (deleted later by the caller),
    or deleted at once without one."""
    final = os.path.abspath(final)
    committed = committed_path(final)
    if not os.path.isdir(committed) or os.path.islink(committed):
        return False
    new_manifest = os.path.join(committed, MANIFEST_NAME)
    if os.path.isfile(new_manifest):
        previous = os.path.join(committed, PREVIOUS_MANIFEST_NAME)
        current = os.path.join(final, MANIFEST_NAME)
        if not os.path.lexists(previous) and os.path.lexists(current):
            os.replace(current, previous)  # from here on the folder is no complete checkpoint until the end
        new_files = _listed_files(new_manifest)
        touched = {final}
        for relative in new_files:
            source = os.path.join(committed, relative)
            if not os.path.lexists(source):
                continue  # moved by an earlier, interrupted call
            target = os.path.join(final, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.isdir(target) and not os.path.islink(target):
                raise CheckpointError(
                    f"cannot put the checkpoint file {target} in place: a folder of that name is in the way. "
                    f"Move it away; the next save or load of {final} then completes this save"
                )
            if trash is not None and os.path.lexists(target):
                _move_into(trash, relative, target)
            os.replace(source, target)
            touched.update(_folders_between(final, relative))
            files.on_stage("file_moved", target)
        touched |= _remove_stale(final, _listed_files(previous), set(new_files), trash)
        for folder in touched:
            fsync_path(folder)
        os.replace(new_manifest, os.path.join(final, MANIFEST_NAME))
        fsync_path(final)
    files.on_stage("published", final)
    shutil.rmtree(committed, ignore_errors=True)
    return True


def _move_into(trash: str, relative: str, path: str) -> None:
    target = os.path.join(trash, relative)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.rename(path, target)


def _remove_stale(final: str, previous: Iterable[str], keep: set[str], trash: str | None) -> set[str]:
    """Remove the files of the previous checkpoint that the new one does not have (regular files only,
    never through a link; into ``trash`` when given), and the subfolders that this leaves empty; returns the
    folders changed."""
    changed = set()
    for relative in previous:
        if relative in keep:
            continue
        path = os.path.join(final, relative)
        if "/" in relative and link_on_the_way(final, os.path.dirname(relative)):
            continue
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(os.lstat(path).st_mode):
                if trash is None:
                    os.remove(path)
                else:
                    _move_into(trash, relative, path)
                changed.add(os.path.dirname(path))
        parent = os.path.dirname(path)
        while parent != final:
            try:
                os.rmdir(parent)  # only succeeds once it is empty: a user's file in it keeps it
            except OSError:
                break
            changed.discard(parent)
            changed.add(os.path.dirname(parent))
            parent = os.path.dirname(parent)
    return changed


def _folders_between(final: str, relative: str) -> list[str]:
    """``final`` and every folder inside it on the way to the file ``relative``: whose entries changed."""
    folders = [final]
    for part in relative.split("/")[:-1]:
        folders.append(os.path.join(folders[-1], part))
    return folders


def recover(final: str) -> None:
    """Bring a folder whose last save was interrupted into a consistent state before it is read: finish a
    committed save into it, or put back a checkpoint that a save of an earlier drivetrain release moved
    aside (``.<name>.replaced``) and died before renaming the new one in."""
    final = os.path.abspath(final)
    if os.path.isdir(final):
        roll_forward(final)
        _remove_left_trash(final)
        return
    parent, name = os.path.split(final)
    replaced = os.path.join(parent, f".{name}{_REPLACED_SUFFIX}")
    if os.path.isdir(replaced) and is_complete(replaced):
        os.rename(replaced, final)
