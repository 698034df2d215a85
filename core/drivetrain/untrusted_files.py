"""Reading files that may come from someone else (a checkpoint's manifest, a weights index, DCP metadata):
names that must stay inside their folder, and JSON read within bounds of size and nesting, so that a
crafted file ends in one clear error instead of a read outside the folder, a ``RecursionError`` or
exhausted memory."""

from __future__ import annotations

import json
import os
from typing import Any

from drivetrain.errors import CheckpointError

#: Deepest nesting of lists and objects read from a JSON file; drivetrain's own files nest 4 deep.
MAX_JSON_DEPTH = 64


def outside_folder(name: str) -> bool:
    """Whether a file name read from a file could lead outside the folder it is relative to: empty,
    absolute, with a ``..`` part, a backslash or a NUL byte (names in these files are relative, with ``/``)."""
    return (
        not name
        or os.path.isabs(name)
        or name.startswith("/")
        or ".." in name.split("/")
        or "\x00" in name
        or "\\" in name
    )


def link_on_the_way(folder: str, name: str) -> str | None:
    """The first part of ``folder/name`` below ``folder`` that is a symbolic link (relative, with ``/``), or
    None: a file reached through a link may be anywhere."""
    path = folder
    parts = name.split("/")
    for count, part in enumerate(parts, 1):
        path = os.path.join(path, part)
        if os.path.islink(path):
            return "/".join(parts[:count])
    return None


def _depth(value: Any) -> int:
    """Nesting depth of lists and dicts, walked without recursion."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_JSON_DEPTH:
            pending.extend((child, depth + 1) for child in children)
    return deepest


def read_json_within(path: str, max_bytes: int, what: str) -> Any:
    """The JSON value in ``path`` (``what`` names the file in errors), refused with a
    :class:`CheckpointError` when larger than ``max_bytes`` (checked before reading it all), nested deeper
    than :data:`MAX_JSON_DEPTH`, or not valid JSON. ``OSError`` (e.g. a missing file) is left to the
    caller."""
    with open(path, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise CheckpointError(
            f"{path} is larger than {max_bytes} bytes, far more than any {what} needs: it is damaged or was "
            "tampered with"
        )
    try:
        value = json.loads(data)
    except RecursionError:
        value = None
        too_deep = True
    except ValueError as exc:
        raise CheckpointError(f"{path} is not a readable {what} ({exc})") from None
    else:
        too_deep = _depth(value) > MAX_JSON_DEPTH
    if too_deep:
        raise CheckpointError(
            f"{path} nests lists or objects more than {MAX_JSON_DEPTH} deep, which no {what} does: it is "
            "damaged or was tampered with"
        )
    return value
