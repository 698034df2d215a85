"""The xla backend's configuration object (``Accelerator(backend_config=XlaConfig(spmd=True))``) and how the
same settings arrive from ``drivetrain launch`` and the config file."""

from __future__ import annotations

from typing import Any

import attrs

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.settings import BackendConfigReader, resolve_backend_config, to_bool


@attrs.define
class XlaConfig:
    """How the xla backend spreads work over the XLA devices of this process.

    - default: one XLA device per process (one TPU chip, or the CPU device), replicas launched by torch_xla.
    - ``spmd=True``: one process drives every device of the host through GSPMD: batches are split on their
      first dimension over a ``("data", "model")`` mesh of all devices, parameters are replicated, and the
      partitioner inserts the gradient all-reduce. Data loaders yield the **global** batch.
    - ``fsdp=True`` (implies SPMD): parameters are sharded over the devices too (torch_xla's
      ``SpmdFullyShardedDataParallel``).
    """

    #: The kernel selects the backend from a configuration object's ``backend_name``.
    backend_name = "xla"

    spmd: bool = attrs.field(default=False, converter=lambda value: to_bool(value, "XlaConfig.spmd"))
    fsdp: bool = attrs.field(default=False, converter=lambda value: to_bool(value, "XlaConfig.fsdp"))

    @property
    def uses_spmd(self) -> bool:
        return self.spmd or self.fsdp


#: Settings of ``XlaConfig`` as keys of ``backend_config`` (config file) and launch options.
FIELDS = ("spmd", "fsdp")


def script_settings(config: XlaConfig) -> dict[str, Any]:
    """The fields ``config`` sets (those not at their default)."""
    defaults = XlaConfig()
    return {
        name: getattr(config, name) for name in FIELDS if getattr(config, name) != getattr(defaults, name)
    }


def parse_settings(raw: dict[str, Any], origin: str) -> dict[str, Any]:
    """``XlaConfig`` fields from ``drivetrain launch`` (``--xla_spmd`` / ``--xla_fsdp``) or the config file's
    ``backend_config``; the launcher's own keys (``tpu_name``, ...) are not the backend's."""
    from drivetrain_xla.launching import LAUNCH_KEYS

    values = dict(raw)
    for flag, field in (("xla_spmd", "spmd"), ("xla_fsdp", "fsdp")):
        if flag in values:
            values.setdefault(field, values.pop(flag))
    unknown = sorted(set(values) - set(FIELDS) - set(LAUNCH_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{origin}: unknown xla setting(s) {', '.join(unknown)} (valid: {', '.join(FIELDS)})"
        )
    return {key: to_bool(values[key], f"XlaConfig.{key}") for key in FIELDS if values.get(key) is not None}


def build(given: XlaConfig | None, settings: dict[str, Any]) -> XlaConfig:
    if given is None:
        return XlaConfig(**settings)
    return attrs.evolve(given, **settings) if settings else given


#: How the kernel reads this backend's configuration (``plugin_api.resolve_backend_config``).
READER = BackendConfigReader(XlaConfig, script_settings, parse_settings, build)


def resolve(backend_config: Any) -> XlaConfig:
    """The script's ``XlaConfig`` with the fields it leaves unset from ``drivetrain launch`` or the config
    file (a field set differently in both is an error naming both), or one built from those alone."""
    return resolve_backend_config(READER, backend_config)
