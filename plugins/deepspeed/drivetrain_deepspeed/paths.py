"""Reading and writing dotted keys of a DeepSpeed config dict (``"zero_optimization.stage"``)."""

from __future__ import annotations

from typing import Any


def get_path(config: dict[str, Any], key: str, default: Any = None) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_path(config: dict[str, Any], key: str, value: Any) -> None:
    node = config
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
