"""``HfDeepSpeedConfig``: a DeepSpeed config dict and the queries scripts (and transformers) make of it.

Accelerate's argument name is kept: ``HfDeepSpeedConfig(config_file_or_dict)``, where the value is a dict,
the path of a JSON file, a JSON string or a base64-encoded JSON string (what ``--deepspeed_config_file``
carries when a launcher passes the config inline).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
from typing import Any

from drivetrain.plugin_api import ConfigurationError

#: Offload devices that move state off the accelerator.
_OFFLOADING = ("cpu", "nvme")


def _parse_text(text: str) -> Any:
    """A JSON string, or base64 of one; ``None`` when it is neither."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return json.loads(base64.urlsafe_b64decode(text.encode("ascii")).decode("utf-8"))
    except (binascii.Error, UnicodeError, ValueError):
        return None


def load_config(source: Any, label: str) -> dict[str, Any]:
    """A copy of the config ``source`` stands for (dict, JSON file path, JSON or base64 JSON text); errors start
    with ``label``, the argument that carried it."""
    if isinstance(source, dict):
        return copy.deepcopy(source)
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigurationError(
            f"{label} must be a dict, a path to a DeepSpeed JSON config or JSON text, got {type(source).__name__}"
        )
    path = os.fspath(source)
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as handle:
                loaded = json.load(handle)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{label}: {path} is not valid JSON ({exc})") from None
        where = path
    else:
        loaded = _parse_text(path)
        if loaded is None:
            raise ConfigurationError(
                f"{label}: DeepSpeed config file {path} does not exist (nor is the text JSON or base64 JSON)"
            )
        where = "the JSON text"
    if not isinstance(loaded, dict):
        raise ConfigurationError(f"{label}: {where} must hold a JSON object")
    return loaded


class HfDeepSpeedConfig:
    """A DeepSpeed config (``.config``, a dict) with dotted-key queries: ``get_value("zero_optimization.stage")``.

    A dict is copied (the caller's dict is never changed); a path is read once (the file is never changed).
    """

    def __init__(self, config_file_or_dict: str | os.PathLike | dict[str, Any]) -> None:
        self.config: dict[str, Any] = load_config(
            config_file_or_dict, "HfDeepSpeedConfig(config_file_or_dict)"
        )
        self.set_stage_and_offload()

    @classmethod
    def wrapping(cls, config: dict[str, Any]) -> HfDeepSpeedConfig:
        """An instance whose ``.config`` is ``config`` itself (not a copy)."""
        instance = cls.__new__(cls)
        instance.config = config
        instance.set_stage_and_offload()
        return instance

    def __repr__(self) -> str:
        return f"HfDeepSpeedConfig({self.config!r})"

    def set_stage_and_offload(self) -> None:
        """Re-read the ZeRO stage and offload devices (call after changing ``.config`` by hand)."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        self._offload = (self.is_zero2() or self.is_zero3()) and any(
            self.get_value(f"zero_optimization.{part}.device") in _OFFLOADING
            for part in ("offload_optimizer", "offload_param")
        )

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """(the dict holding the last part of the dotted key, that part); (None, part) when a parent is absent."""
        node: Any = self.config
        *parents, last = ds_key_long.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, last
        return (node if isinstance(node, dict) else None), last

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at a dotted key (``"zero_optimization.stage"``), or ``default`` when it is not set."""
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the entry at a dotted key; a missing one is an error only with ``must_exist``."""
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ConfigurationError(
                    f"HfDeepSpeedConfig: the config has no {ds_key_long!r} entry to delete"
                )
            return
        del node[key]

    def is_true(self, ds_key_long: str) -> bool:
        """True only when the key is set to a true value (False when unset)."""
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """True only when the key is set to a false value (False when unset)."""
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        """Optimizer states or parameters offloaded to CPU/NVMe (read at ZeRO stages 2 and 3, as Accelerate)."""
        return self._offload
