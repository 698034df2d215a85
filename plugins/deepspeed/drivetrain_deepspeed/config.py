"""What a user tells the deepspeed backend: :class:`DeepSpeedPlugin` and the DeepSpeed config it stands for.

A ``DeepSpeedPlugin`` either points at a DeepSpeed JSON config (``hf_ds_config``: a path or a dict) or builds
one from its fields. In both cases the fields fill the config's ``"auto"`` values; a field that contradicts
an explicit config value is an error naming both. The remaining ``"auto"`` values (batch sizes, precision,
optimizer and scheduler parameters) are filled at ``prepare`` time from the Accelerator and the prepared
objects (see :mod:`drivetrain_deepspeed.autofill`).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, ClassVar

import attrs

from drivetrain.plugin_api import ConfigurationError
from drivetrain_deepspeed.paths import get_path, set_path

OFFLOAD_DEVICES = ("none", "cpu", "nvme")
#: ZeRO stage used when neither the plugin nor the config file names one (Accelerate's default too).
DEFAULT_ZERO_STAGE = 2
#: A DeepSpeed config never prints its progress unless it asks to (DeepSpeed's default is every 10 steps).
QUIET_STEPS_PER_PRINT = 2**62


class HfDeepSpeedConfig:
    """A DeepSpeed config dict with the queries transformers and Accelerate scripts make of it.

    ``config`` is a dict or the path of a JSON file. Reading a path takes a copy: the file is not changed.
    """

    def __init__(self, config: str | os.PathLike | dict[str, Any]) -> None:
        if isinstance(config, dict):
            self.config: dict[str, Any] = copy.deepcopy(config)
        elif isinstance(config, (str, os.PathLike)):
            path = os.fspath(config)
            if not os.path.isfile(path):
                raise ConfigurationError(
                    f"DeepSpeedPlugin.hf_ds_config: DeepSpeed config file {path} does not exist"
                )
            try:
                with open(path, encoding="utf-8") as handle:
                    self.config = json.load(handle)
            except json.JSONDecodeError as exc:
                raise ConfigurationError(
                    f"DeepSpeedPlugin.hf_ds_config: {path} is not valid JSON ({exc})"
                ) from None
            if not isinstance(self.config, dict):
                raise ConfigurationError(f"DeepSpeedPlugin.hf_ds_config: {path} must hold a JSON object")
        else:
            raise ConfigurationError(
                f"DeepSpeedPlugin.hf_ds_config must be a path to a JSON file or a dict, got {type(config).__name__}"
            )

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """(the dict holding the last part of the dotted key, that part); (None, part) when absent."""
        node: Any = self.config
        *parents, last = ds_key_long.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, last
        return (node if isinstance(node, dict) else None), last

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at a dotted key (``"zero_optimization.stage"``), or ``default``."""
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def is_true(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        return self.get_value("zero_optimization.stage") == 2

    def is_zero3(self) -> bool:
        return self.get_value("zero_optimization.stage") == 3

    def is_offload(self) -> bool:
        return any(
            self.get_value(f"zero_optimization.{part}.device") in ("cpu", "nvme")
            for part in ("offload_optimizer", "offload_param")
        )


def _optional(validator: Any) -> Any:
    return attrs.validators.optional(validator)


def _named_check(test: Any, expected: str) -> Any:
    """An attrs validator whose error names the field and what would be valid."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None and not test(value):
            raise ConfigurationError(
                f"DeepSpeedPlugin.{attribute.name}={value!r} is not valid; expected {expected}"
            )

    return check


def _is_auto(value: Any) -> bool:
    return value == "auto"


def _to_bool(value: Any) -> Any:
    if isinstance(value, str) and value.lower() in ("true", "1", "yes"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "0", "no"):
        return False
    return value


def _to_names(value: Any) -> Any:
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    return value


def _offload_device(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


@attrs.define(eq=False)
class DeepSpeedPlugin:
    """Configuration of the DeepSpeed backend (``Accelerator(deepspeed_plugin=DeepSpeedPlugin(...))``).

    Fields left at ``None`` come from the DeepSpeed config (``hf_ds_config``) or, failing that, from the
    Accelerator (accumulation steps, precision) and DeepSpeed's defaults.
    """

    backend_name: ClassVar[str] = "deepspeed"

    #: DeepSpeed config: path of a JSON file or a dict. Without it the fields below build the config.
    hf_ds_config: Any = attrs.field(
        default=None,
        validator=_named_check(
            lambda v: isinstance(v, (str, os.PathLike, dict, HfDeepSpeedConfig)),
            "a path to a DeepSpeed JSON config or a dict",
        ),
    )
    zero_stage: int | None = attrs.field(
        default=None,
        converter=lambda v: int(v) if isinstance(v, str) and v.isdigit() else v,
        validator=_named_check(lambda v: v in (0, 1, 2, 3) and not isinstance(v, bool), "0, 1, 2 or 3"),
    )
    gradient_accumulation_steps: int | None = attrs.field(
        default=None,
        converter=lambda v: int(v) if isinstance(v, str) and v.isdigit() else v,
        validator=_named_check(
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"
        ),
    )
    gradient_clipping: float | None = attrs.field(
        default=None,
        converter=lambda v: float(v) if isinstance(v, (int, str)) and not isinstance(v, bool) else v,
        validator=_named_check(lambda v: isinstance(v, float) and v > 0, "a number > 0"),
    )
    offload_optimizer_device: str | None = attrs.field(
        default=None,
        converter=_offload_device,
        validator=_named_check(lambda v: v in OFFLOAD_DEVICES, "one of none, cpu, nvme"),
    )
    offload_param_device: str | None = attrs.field(
        default=None,
        converter=_offload_device,
        validator=_named_check(lambda v: v in OFFLOAD_DEVICES, "one of none, cpu, nvme"),
    )
    offload_optimizer_nvme_path: str | None = attrs.field(
        default=None,
        validator=_named_check(lambda v: isinstance(v, str), "a folder path"),
    )
    offload_param_nvme_path: str | None = attrs.field(
        default=None,
        validator=_named_check(lambda v: isinstance(v, str), "a folder path"),
    )
    zero3_init_flag: bool | None = attrs.field(
        default=None,
        converter=_to_bool,
        validator=_named_check(lambda v: isinstance(v, bool), "true or false"),
    )
    zero3_save_16bit_model: bool | None = attrs.field(
        default=None,
        converter=_to_bool,
        validator=_named_check(lambda v: isinstance(v, bool), "true or false"),
    )
    transformer_moe_cls_names: list[str] | None = attrs.field(
        default=None,
        converter=_to_names,
        validator=_named_check(
            lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
            "a list of class names (or one comma-separated string)",
        ),
    )

    #: this plugin is the active one of a ``deepspeed_plugins`` dict (see selection.py)
    selected: bool = attrs.field(default=False, repr=False)
    #: the DeepSpeed config with the fields applied ("auto" values still to fill at prepare time)
    deepspeed_config: dict[str, Any] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for name, device in (
            ("offload_optimizer", self.offload_optimizer_device),
            ("offload_param", self.offload_param_device),
        ):
            path = getattr(self, f"{name}_nvme_path")
            if device == "nvme" and not path:
                raise ConfigurationError(
                    f"DeepSpeedPlugin.{name}_device='nvme' needs DeepSpeedPlugin.{name}_nvme_path (a folder on the "
                    "NVMe disk)"
                )
        if self.offload_param_device not in (None, "none") and self.zero_stage not in (None, 3):
            raise ConfigurationError(
                f"DeepSpeedPlugin.offload_param_device={self.offload_param_device!r} needs zero_stage=3 "
                f"(parameters are partitioned only at stage 3), got zero_stage={self.zero_stage}"
            )
        if self.hf_ds_config is None:
            self.deepspeed_config = self._config_from_fields()
        else:
            source = self.hf_ds_config
            base = (
                source.config if isinstance(source, HfDeepSpeedConfig) else HfDeepSpeedConfig(source).config
            )
            self.deepspeed_config = self._apply_fields(copy.deepcopy(base))

    # -- building the DeepSpeed config -------------------------------------------------------------------
    def _config_from_fields(self) -> dict[str, Any]:
        zero: dict[str, Any] = {
            "stage": self.zero_stage if self.zero_stage is not None else DEFAULT_ZERO_STAGE,
            "offload_optimizer": {"device": self.offload_optimizer_device or "none"},
            "offload_param": {"device": self.offload_param_device or "none"},
            "stage3_gather_16bit_weights_on_model_save": bool(self.zero3_save_16bit_model),
        }
        if self.offload_optimizer_nvme_path:
            zero["offload_optimizer"]["nvme_path"] = self.offload_optimizer_nvme_path
        if self.offload_param_nvme_path:
            zero["offload_param"]["nvme_path"] = self.offload_param_nvme_path
        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": self.gradient_accumulation_steps or "auto",
            "zero_optimization": zero,
            "bf16": {"enabled": "auto"},
            "fp16": {"enabled": "auto"},
            "steps_per_print": QUIET_STEPS_PER_PRINT,
        }
        if self.gradient_clipping is not None:
            config["gradient_clipping"] = self.gradient_clipping
        return config

    def _apply_fields(self, config: dict[str, Any]) -> dict[str, Any]:
        """Fill the config's "auto" (or missing) entries from the fields set; a field that differs from an
        explicit config value is an error naming both."""
        zero_stage = self.zero_stage
        mapping = [
            ("gradient_accumulation_steps", "gradient_accumulation_steps", self.gradient_accumulation_steps),
            ("gradient_clipping", "gradient_clipping", self.gradient_clipping),
            ("zero_stage", "zero_optimization.stage", zero_stage),
            (
                "offload_optimizer_device",
                "zero_optimization.offload_optimizer.device",
                self.offload_optimizer_device,
            ),
            ("offload_param_device", "zero_optimization.offload_param.device", self.offload_param_device),
            (
                "offload_optimizer_nvme_path",
                "zero_optimization.offload_optimizer.nvme_path",
                self.offload_optimizer_nvme_path,
            ),
            (
                "offload_param_nvme_path",
                "zero_optimization.offload_param.nvme_path",
                self.offload_param_nvme_path,
            ),
            (
                "zero3_save_16bit_model",
                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                self.zero3_save_16bit_model,
            ),
        ]
        for field_name, key, value in mapping:
            if value is None:
                continue
            set_config_value(config, key, value, f"DeepSpeedPlugin.{field_name}={value!r}")
        config.setdefault("steps_per_print", QUIET_STEPS_PER_PRINT)
        if get_path(config, "zero_optimization.stage") == "auto" and zero_stage is None:
            set_path(config, "zero_optimization.stage", DEFAULT_ZERO_STAGE)
        return config

    # -- queries ------------------------------------------------------------------------------------------
    @property
    def hf_config(self) -> HfDeepSpeedConfig:
        return HfDeepSpeedConfig(self.deepspeed_config)

    @property
    def stage(self) -> int:
        stage = get_path(self.deepspeed_config, "zero_optimization.stage", 0)
        return DEFAULT_ZERO_STAGE if stage == "auto" else int(stage)

    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag) and self.stage == 3

    def zero3_init_context_manager(self, enable: bool = False) -> Any:
        """``deepspeed.zero.Init`` for this configuration when ``enable`` (Accelerate's method name)."""
        from drivetrain_deepspeed.zero_init import partitioned_init

        return partitioned_init(self, "no", enabled=enable)

    def select(self) -> None:
        self.selected = True

    def _unselect(self) -> None:
        self.selected = False

    # -- from the launcher / config file --------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: dict[str, Any], origin: str) -> DeepSpeedPlugin:
        """A plugin from a config file's ``deepspeed_config`` section or ``DRIVETRAIN_BACKEND_CONFIG``.

        Accepts the field names and Accelerate's keys (``deepspeed_config_file``,
        ``deepspeed_moe_layer_cls_names``); the multi-node launcher keys are read by the launcher only.
        """
        fields = {field.name for field in attrs.fields(cls) if field.init and field.name != "selected"}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = ACCELERATE_KEYS.get(key, key)
            if name in LAUNCHER_KEYS:
                continue
            if name not in fields:
                raise ConfigurationError(
                    f"{origin}: unknown deepspeed setting {key!r}; valid: "
                    f"{', '.join(sorted(fields | set(ACCELERATE_KEYS) | set(LAUNCHER_KEYS)))}"
                )
            if value is None or value == "none" and name.endswith("_path"):
                continue
            kwargs[name] = value
        try:
            return cls(**kwargs)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{origin}: {exc}") from None


#: Accelerate's ``deepspeed_config`` keys that have another name here.
ACCELERATE_KEYS = {
    "deepspeed_config_file": "hf_ds_config",
    "deepspeed_moe_layer_cls_names": "transformer_moe_cls_names",
}
#: Keys only the multi-node launcher reads (see launcher.py).
LAUNCHER_KEYS = (
    "deepspeed_hostfile",
    "deepspeed_multinode_launcher",
    "deepspeed_inclusion_filter",
    "deepspeed_exclusion_filter",
)


# -- dotted-key helpers ------------------------------------------------------------------------------------------
def set_config_value(config: dict[str, Any], key: str, value: Any, source: str) -> None:
    """Put ``value`` at ``key`` unless the config holds a different explicit value (then raise)."""
    current = get_path(config, key)
    if current is None or current == "auto" or current == value:
        set_path(config, key, value)
        return
    raise ConfigurationError(
        f"conflicting DeepSpeed setting {key!r}: the DeepSpeed config says {current!r} but {source}; "
        f'set it in one place only (or write "auto" in the config)'
    )
