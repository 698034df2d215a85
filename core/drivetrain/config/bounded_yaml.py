"""Reading a settings file (YAML) with bounds, so that a hostile or broken file costs milliseconds and a
one-line error, never minutes and gigabytes.

PyYAML's ``safe_load`` runs no code, but it has no limits: a 100 MB file is parsed whole, 100 000 nested
brackets end in a RecursionError, and an alias bomb (``b: [*a, *a, ...]``, each level nine times the
previous) loads quickly as shared references and then explodes in whatever walks the values (checking,
printing, passing them to the processes as JSON). So a file is read here only when:

- it is at most :data:`MAX_FILE_BYTES` long (read with a bound, so a FIFO or ``/dev/zero`` is refused too);
- its collections nest at most :data:`MAX_DEPTH` levels, counting the levels aliases add;
- with every alias expanded, it holds at most :data:`MAX_EXPANDED_SIZE` (one per node, plus each scalar's
  characters): aliases stay usable for what they are meant for, repeating a block or two;
- it is one YAML document of UTF-8 text whose values construct (an integer of 10 000 digits does not).
"""

from __future__ import annotations

import os
from typing import Any

from drivetrain.errors import ConfigurationError

#: A config file holds a few settings (Accelerate's are under 1 KiB; a DeepSpeed section a few KiB).
MAX_FILE_BYTES = 1024 * 1024
#: Levels of nested mappings and lists (a config file uses three or four).
MAX_DEPTH = 64
#: Size of the document with its aliases expanded: one per node plus each scalar's length.
MAX_EXPANDED_SIZE = 4 * MAX_FILE_BYTES


class _Refused(Exception):
    """The file is refused (a bound passed, a value Python cannot hold); the message says why, in one line."""


def _loader_class() -> type:
    """PyYAML's safe loader, composing with a depth count (imported on first use: ``drivetrain launch``
    without a config file does not import yaml). The composer is recursive, so without the count a deeply
    nested file ends in a RecursionError before any check could run."""
    import yaml

    class DepthLimitedLoader(yaml.SafeLoader):
        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    line = self.peek_event().start_mark.line + 1
                    raise _Refused(f"nests deeper than {MAX_DEPTH} levels (line {line})")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return DepthLimitedLoader


_LOADER: type | None = None


def _expanded_size(root: Any) -> None:
    """Raise _Refused when ``root`` (a composed node graph, in which an alias is the anchored node
    itself) would be too large or too deep with its aliases expanded, or refers to itself. Each node is
    measured once, so a bomb is measured in the time its text takes to read."""
    import yaml

    def too_deep(node: Any) -> _Refused:
        return _Refused(
            f"nests deeper than {MAX_DEPTH} levels once its aliases are expanded (line {node.start_mark.line + 1})"
        )

    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded depth below it)
    open_nodes: set[int] = set()

    def measure(node: Any, depth: int) -> tuple[int, int]:
        if depth > MAX_DEPTH:  # checked on the way down too: a chain of aliases is deep, not wide
            raise too_deep(node)
        key = id(node)
        if key in sizes:
            size, below = sizes[key]
        elif key in open_nodes:
            raise _Refused(f"refers to itself through an alias (line {node.start_mark.line + 1})")
        elif isinstance(node, yaml.ScalarNode):
            size, below = 1 + len(node.value), 0
        else:
            open_nodes.add(key)
            children = (
                [child for pair in node.value for child in pair]
                if isinstance(node, yaml.MappingNode)
                else list(node.value)
            )
            size, below = 1, 0
            for child in children:
                child_size, child_below = measure(child, depth + 1)
                size += child_size
                below = max(below, child_below + 1)
                if size > MAX_EXPANDED_SIZE:
                    break
            open_nodes.discard(key)
            sizes[key] = (size, below)
        if size > MAX_EXPANDED_SIZE:
            raise _Refused(
                f"expands to more than {MAX_EXPANDED_SIZE} nodes and characters once its aliases (*name) are "
                f"replaced by what they name (line {node.start_mark.line + 1}); write the values out instead"
            )
        if depth + below > MAX_DEPTH:
            raise too_deep(node)
        return size, below

    measure(root, 0)


def read_text(path: str | os.PathLike, origin: str) -> str:
    """The file's text, read with the size bound; ``origin`` names the file in errors."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except IsADirectoryError:
        raise ConfigurationError(f"{origin} is a folder, not a file") from None
    except OSError as exc:
        raise ConfigurationError(f"{origin} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigurationError(
            f"{origin} is larger than {MAX_FILE_BYTES // 1024} KiB; a config file holds a few settings"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{origin} is not UTF-8 text (byte {exc.start})") from None


def parse(text: str, origin: str) -> Any:
    """The YAML document in ``text``, within the bounds of this module; a ConfigurationError otherwise."""
    global _LOADER
    import yaml

    if _LOADER is None:
        _LOADER = _loader_class()
    loader = None
    try:
        loader = _LOADER(text)  # checks the characters first (no NUL, no other control characters)
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return _construct(loader, node)
    except _Refused as exc:
        raise ConfigurationError(f"{origin} {exc}") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigurationError(f"{origin} is not valid YAML: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _construct(loader: Any, node: Any) -> Any:
    """The Python values of a checked node graph. A value YAML reads but Python cannot hold (an integer
    of 5000 digits, the 30th of February) makes PyYAML's constructors raise what Python raised, which is
    not a YAMLError (``!!timestamp`` with a bad date even raises an AttributeError)."""
    import yaml

    try:
        return loader.construct_document(node)
    except yaml.YAMLError:
        raise
    except Exception as exc:
        problem = " ".join(str(exc).split(";")[0].split())  # after ';' Python's advice, not the user's
        raise _Refused(f"holds a value that cannot be read ({type(exc).__name__}: {problem})") from None


def load_mapping(path: str | os.PathLike, origin: str) -> dict[str, Any]:
    """Read ``path`` as a YAML mapping of settings (an empty file is an empty mapping)."""
    data = parse(read_text(path, origin), origin)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigurationError(f"{origin} must hold a mapping of settings, not {type(data).__name__}")
    return data


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a value quoted in a one-line error."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxstring = shortener.maxother = limit
    shortener.maxlevel = 3
    text = shortener.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
