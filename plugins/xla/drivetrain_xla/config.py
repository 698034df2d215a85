"""The xla backend's configuration object (``Accelerator(backend_config=XlaConfig(spmd=True))``) and how the
same settings arrive from ``drivetrain launch`` and the config file."""

from __future__ import annotations

from typing import Any

import attrs

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.settings import backend_settings, to_bool


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

    spmd: bool = attrs.field(default=False, converter=to_bool)
    fsdp: bool = attrs.field(default=False, converter=to_bool)

    @property
    def uses_spmd(self) -> bool:
        return self.spmd or self.fsdp


#: Settings of ``XlaConfig`` as keys of ``backend_config`` (config file) and launch options.
FIELDS = ("spmd", "fsdp")


def resolve(backend_config: Any) -> XlaConfig:
    """The script's ``XlaConfig``, else one built from what ``drivetrain launch`` or the config file set."""
    if backend_config is not None:
        if not isinstance(backend_config, XlaConfig):
            raise ConfigurationError(
                f"backend 'xla' takes an XlaConfig as backend_config, got {type(backend_config).__name__}"
            )
        return backend_config
    origin, values = backend_settings("xla")
    from drivetrain_xla.launching import LAUNCH_KEYS

    values = dict(values)
    # drivetrain launch --xla_spmd / --xla_fsdp (the backend's launch options arrive in its settings)
    for flag, field in (("xla_spmd", "spmd"), ("xla_fsdp", "fsdp")):
        if flag in values:
            values.setdefault(field, values.pop(flag))
    unknown = sorted(set(values) - set(FIELDS) - set(LAUNCH_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{origin}: unknown xla setting(s) {', '.join(unknown)} (valid: {', '.join(FIELDS)})"
        )
    try:
        return XlaConfig(**{key: values[key] for key in FIELDS if key in values})
    except ConfigurationError as exc:
        raise ConfigurationError(f"{origin}: {exc}") from None
