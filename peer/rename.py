"""The one mechanical rename the peer suite applies to the reference's tests: the package name.

Rule (nothing else in a file changes):

1. every Python name token `accelerate` becomes `drivetrain` (``import accelerate``, ``from accelerate.utils
   import x``, ``inspect.getfile(accelerate)``);
2. inside a string literal, `accelerate` becomes `drivetrain` where it names the package: the whole string is
   ``"accelerate"`` (the console command), or the word starts a dotted module path (``"accelerate.utils.x"``:
   mock.patch targets, logger names) or follows ``import `` / ``from `` (code run through ``python -c``).

Untouched on purpose: ``ACCELERATE_*`` environment names (a drop-in honours the reference's variables, so the
tests keep setting them as users do), ``path_in_accelerate_package`` and other identifiers that merely contain
the word, prose, URLs and file paths (``~/.cache/huggingface/accelerate``).
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

OLD = "accelerate"
NEW = "drivetrain"

# `accelerate` inside a string, as a module path: not part of a longer word, path or distribution name.
_IN_STRING = re.compile(
    r"(?<![\w/.-])accelerate(?=\.[A-Za-z_])|(?<=import )accelerate\b|(?<=from )accelerate\b"
)


@dataclass
class Replacement:
    line: int
    kind: str  # "name" or "string"
    before: str
    after: str


def rename_source(source: str) -> tuple[str, list[Replacement]]:
    """Return `source` with the package renamed, and every replacement made (line, kind, token before/after)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str, Replacement]] = []  # (row, col_start, col_end, text, record)
    for token in tokens:
        if token.type == tokenize.NAME and token.string == OLD:
            (row, col), (_, end) = token.start, token.end
            edits.append((row, col, end, NEW, Replacement(row, "name", OLD, NEW)))
        elif token.type == tokenize.STRING:
            new = _rename_string(token.string)
            if new != token.string:
                (row, col), (end_row, end) = token.start, token.end
                if row != end_row:  # a multi-line string: rewrite line by line below
                    for offset, (old_line, new_line) in enumerate(
                        zip(token.string.splitlines(keepends=True), new.splitlines(keepends=True))
                    ):
                        if old_line != new_line:
                            start = col if offset == 0 else 0
                            edits.append(
                                (
                                    row + offset,
                                    start,
                                    start + len(old_line.rstrip("\r\n")),
                                    new_line.rstrip("\r\n"),
                                    Replacement(row + offset, "string", old_line.strip(), new_line.strip()),
                                )
                            )
                    continue
                edits.append((row, col, end, new, Replacement(row, "string", token.string, new)))
    for row, start, end, text, _ in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:start] + text + line[end:]
    return "".join(lines), [edit[4] for edit in sorted(edits, key=lambda e: (e[0], e[1]))]


def _rename_string(literal: str) -> str:
    # Find where the quotes end so the prefix (f, r, b...) and the quotes themselves stay as they are.
    match = re.match(r"([A-Za-z]*)('''|\"\"\"|'|\")", literal)
    if match is None:
        return literal
    prefix, quote = match.groups()
    body = literal[len(prefix) + len(quote) : -len(quote)]
    if body == OLD:
        body = NEW
    else:
        body = _IN_STRING.sub(NEW, body)
    return f"{prefix}{quote}{body}{quote}"


def rename_tree(source_dir: Path, target_dir: Path) -> dict[str, list[dict]]:
    """Copy `source_dir` to `target_dir`, renaming every .py file; other files are copied as they are.
    Returns {relative path: [replacement records]} for the files that changed."""
    log: dict[str, list[dict]] = {}
    for path in sorted(source_dir.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        relative = path.relative_to(source_dir)
        target = target_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix != ".py":
            target.write_bytes(path.read_bytes())
            continue
        text, replacements = rename_source(path.read_text(encoding="utf-8"))
        target.write_text(text, encoding="utf-8")
        if replacements:
            log[str(relative)] = [vars(r) for r in replacements]
    return log
