"""A backend's configuration object, resolved from every source the way the kernel's settings are.

Sources, highest precedence first (see docs/configuration.md):

1. **the script**: the object passed as ``Accelerator(backend_config=...)`` or Accelerate's alias
   (``fsdp_plugin=``, ``deepspeed_plugin=``, ``megatron_lm_plugin=``);
2. **the environment**: what ``drivetrain launch`` hands over in ``DRIVETRAIN_BACKEND_CONFIG`` (the backend's
   flags and config-file section), then the backend's own variables (Accelerate's ``MEGATRON_LM_*``,
   ``ACCELERATE_DEEPSPEED_*``);
3. **the config file** named by ``DRIVETRAIN_CONFIG_FILE``: its section for the backend.

Every source is read field by field; two that set a field to different values raise a
:class:`~drivetrain.errors.ConfigurationError` naming both, and the fields the script's object leaves unset
are filled from the others. The backend says how to read its own object (:class:`BackendConfigReader`); the
kernel does the rest, the same way for every backend.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from drivetrain.errors import ConfigurationError

#: ``(where the mapping comes from, the mapping)``: a source of raw settings (keys as a launcher or config
#: file writes them).
RawSource = tuple[str, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class BackendConfigReader:
    """How a backend reads its configuration object (the argument of ``plugin_api.resolve_backend_config``):

    - ``config_class``: the class a script's object must be; its ``backend_name`` names the backend;
    - ``script_settings(obj) -> {field: value}``: the fields the script's object sets (not its defaults);
    - ``parse(raw, origin) -> {field: value}``: a mapping as the launcher, a variable or the config file writes
      it, with the values as the object holds them; an unknown key or a bad value raises ConfigurationError;
    - ``build(given, settings) -> config``: the configuration, ``settings`` (the fields the script's object left
      unset) added to ``given`` (None when the script passed no object);
    - ``variables() -> [(origin, mapping)]`` (optional): the backend's own environment variables, one source
      each, read after the launcher's settings and before the config file.
    """

    config_class: type
    script_settings: Callable[[Any], dict[str, Any]]
    parse: Callable[[dict[str, Any], str], dict[str, Any]]
    build: Callable[[Any, dict[str, Any]], Any]
    variables: Callable[[], list[RawSource]] | None = None

    @property
    def backend(self) -> str:
        return str(self.config_class.backend_name)  # type: ignore[attr-defined]


def resolve(
    reader: BackendConfigReader,
    given: Any,
    *,
    launched: tuple[str | None, dict[str, Any]],
    config_file: tuple[str | None, dict[str, Any]],
) -> Any:
    """The configuration of ``reader.backend`` from the script's object ``given`` (or None), the settings
    ``drivetrain launch`` handed over (``launched``), the backend's variables and the config file's section;
    ``launched`` and ``config_file`` are ``(None, {})`` when absent."""
    if given is not None and not isinstance(given, reader.config_class):
        raise ConfigurationError(
            f"the {reader.backend} backend takes {reader.config_class.__name__} objects as its configuration, "
            f"got {type(given).__name__}"
        )
    raw_sources = [launched, *(reader.variables() if reader.variables else []), config_file]
    layers: list[tuple[str, dict[str, Any]]] = []
    for origin, raw in raw_sources:
        if origin is not None and raw:
            layers.append((origin, _parsed(reader, origin, raw)))
    script = reader.script_settings(given) if given is not None else {}
    chosen: dict[str, tuple[Any, str]] = {}
    for origin, values in layers:
        for field, value in values.items():
            if field in script and script[field] != value:
                raise ConfigurationError(
                    f"conflicting {reader.backend} setting {field!r}: {reader.config_class.__name__}("
                    f"{field}={_shown(script[field])}) in the script but {_shown(value)} from {origin}; remove "
                    "one of them or make them agree"
                )
            if field in chosen and chosen[field][0] != value:
                raise ConfigurationError(
                    f"conflicting {reader.backend} setting {field!r}: {_shown(chosen[field][0])} from "
                    f"{chosen[field][1]} but {_shown(value)} from {origin}; remove one of them or make them agree"
                )
            chosen.setdefault(field, (value, origin))
    added = {field: value for field, (value, _) in chosen.items() if field not in script}
    try:
        return reader.build(given, added)
    except ConfigurationError as exc:
        origins = sorted({chosen[field][1] for field in added})
        if not origins or any(origin in str(exc) for origin in origins):
            raise
        raise ConfigurationError(f"{' and '.join(origins)}: {exc}") from None


def _shown(value: Any) -> str:
    """A value as a user writes it: an enumeration member by its value (``'NO_SHARD'``)."""
    return repr(value.value) if isinstance(value, enum.Enum) else repr(value)


def _parsed(reader: BackendConfigReader, origin: str, raw: dict[str, Any]) -> dict[str, Any]:
    try:
        return reader.parse(raw, origin)
    except ConfigurationError as exc:
        if origin in str(exc):
            raise
        raise ConfigurationError(f"{origin}: {exc}") from None
