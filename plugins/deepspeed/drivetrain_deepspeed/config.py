"""What a user tells the deepspeed backend: :class:`DeepSpeedPlugin` and the DeepSpeed config it stands for.

A ``DeepSpeedPlugin`` either points at a DeepSpeed JSON config (``hf_ds_config``: a path or a dict) or builds
one from its fields. In both cases the fields fill the config's ``"auto"`` values; a field that contradicts
an explicit config value is an error naming both. The remaining ``"auto"`` values (batch sizes, precision,
optimizer and scheduler parameters) are filled at ``prepare`` time from the Accelerator and the prepared
objects (see :mod:`drivetrain_deepspeed.autofill`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import attrs

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.settings import BackendConfigReader, resolve_backend_config, to_bool
from drivetrain_deepspeed.hf_config import HfDeepSpeedConfig, load_config
from drivetrain_deepspeed.paths import get_path, set_path

OFFLOAD_DEVICES = ("none", "cpu", "nvme")
#: ZeRO stage used when neither the plugin nor the config file names one (Accelerate's default too).
DEFAULT_ZERO_STAGE = 2
#: A DeepSpeed config never prints its progress unless it asks to (DeepSpeed's default is every 10 steps).
QUIET_STEPS_PER_PRINT = 2**62


def _named_check(test: Any, expected: str) -> Any:
    """An attrs validator whose error names the field and what would be valid."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None and not test(value):
            raise ConfigurationError(
                f"DeepSpeedPlugin.{attribute.name}={value!r} is not valid; expected {expected}"
            )

    return check


def _to_bool(value: Any) -> Any:
    """A boolean word (``"true"``, ``"no"``, ...) as a bool; anything else is left for the field's check."""
    if isinstance(value, str):
        with contextlib.suppress(ConfigurationError):
            return to_bool(value)
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
        validator=_named_check(lambda v: isinstance(v, float) and v >= 0, "a number >= 0 (0: no clipping)"),
    )
    #: with several data loaders in one ``prepare`` call and an "auto" micro batch size: take the smallest
    #: batch size (True) or the largest (False)
    is_train_batch_min: bool = attrs.field(
        default=True,
        converter=_to_bool,
        validator=_named_check(lambda v: isinstance(v, bool), "true or false"),
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
    #: MS-AMP FP8 through DeepSpeed: refused here (see __attrs_post_init__)
    enable_msamp: bool | None = attrs.field(
        default=None,
        converter=_to_bool,
        validator=_named_check(lambda v: isinstance(v, bool), "true or false"),
    )
    msamp_opt_level: str | None = attrs.field(
        default=None,
        validator=_named_check(lambda v: v in ("O1", "O2"), "'O1' or 'O2'"),
    )

    #: the DeepSpeed config with the fields applied ("auto" values still to fill at prepare time); also
    #: ``hf_ds_config.config`` once the plugin is built
    deepspeed_config: dict[str, Any] = attrs.field(init=False, repr=False)
    #: this plugin is the active one (see selection.py); read through ``selected``
    _selected: bool = attrs.field(default=False, init=False, repr=False)
    #: what transformers' DeepSpeed weakref points at after set_deepspeed_weakref() (kept alive here)
    dschf: Any = attrs.field(default=None, init=False, repr=False)
    #: the fields as the script set them, before the config filled the others (see :func:`script_settings`)
    _script_fields: dict[str, Any] = attrs.field(factory=dict, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        defaults = {field.name: field.default for field in attrs.fields(type(self)) if field.init}
        self._script_fields = {
            name: getattr(self, name)
            for name, default in defaults.items()
            if getattr(self, name) is not None and getattr(self, name) != default
        }
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
        if self.enable_msamp:
            raise ConfigurationError(
                "DeepSpeedPlugin.enable_msamp=True: MS-AMP FP8 is not available with drivetrain's deepspeed backend "
                "(MS-AMP needs CUDA GPUs and its own package, which is not on PyPI); use mixed_precision='bf16'"
            )
        self.enable_msamp = False
        if self.msamp_opt_level is None:
            self.msamp_opt_level = "O1"  # Accelerate's default; read only with enable_msamp
        if isinstance(self.hf_ds_config, HfDeepSpeedConfig):
            # As Accelerate: a config object given is kept, its dict shared. transformers gives its
            # HfTrainerDeepSpeedConfig (a subclass) and fills the "auto" entries in that dict after the plugin
            # is built (trainer_config_finalize), which the engine must then see.
            self.deepspeed_config = self._apply_fields(self.hf_ds_config.config)
            self.hf_ds_config.set_stage_and_offload()
        else:
            if self.hf_ds_config is None:
                self.deepspeed_config = self._config_from_fields()
            else:
                base = load_config(self.hf_ds_config, "DeepSpeedPlugin.hf_ds_config")
                self.deepspeed_config = self._apply_fields(copy.deepcopy(base))
            # As Accelerate: hf_ds_config becomes the config object (sharing the dict) and the fields the
            # config's values, so scripts can read e.g. ``deepspeed_plugin.zero_stage`` whichever way it was
            # configured.
            self.hf_ds_config = HfDeepSpeedConfig.wrapping(self.deepspeed_config)
        self._fields_from_config()
        if self.zero3_init_flag is None:
            self.zero3_init_flag = self.stage == 3
        elif self.zero3_init_flag and self.stage != 3:
            warnings.warn(
                f"DeepSpeedPlugin.zero3_init_flag=True applies to ZeRO stage 3 only; this configuration is stage "
                f"{self.stage}, so it is set to False",
                stacklevel=3,
            )
            self.zero3_init_flag = False
        if "transformers" in sys.modules:
            from drivetrain_deepspeed.transformers_link import keep_transformers_current

            keep_transformers_current()

    def _fields_from_config(self) -> None:
        config = self.deepspeed_config
        self.zero_stage = self.stage
        for part in ("offload_optimizer", "offload_param"):
            device = get_path(config, f"zero_optimization.{part}.device")
            setattr(self, f"{part}_device", device if device in OFFLOAD_DEVICES else "none")
            path = get_path(config, f"zero_optimization.{part}.nvme_path")
            if isinstance(path, str) and getattr(self, f"{part}_nvme_path") is None:
                setattr(self, f"{part}_nvme_path", path)
        steps = config.get("gradient_accumulation_steps")
        if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1:
            self.gradient_accumulation_steps = steps
        clipping = config.get("gradient_clipping")
        if isinstance(clipping, (int, float)) and not isinstance(clipping, bool) and clipping > 0:
            self.gradient_clipping = float(clipping)
        save_16bit = get_path(config, "zero_optimization.stage3_gather_16bit_weights_on_model_save")
        self.zero3_save_16bit_model = save_16bit if isinstance(save_16bit, bool) else False

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
    def stage(self) -> int:
        stage = get_path(self.deepspeed_config, "zero_optimization.stage", 0)
        return DEFAULT_ZERO_STAGE if stage == "auto" else int(stage)

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The config's value at a dotted key (``"zero_optimization.stage"``), or ``default``."""
        return self.hf_ds_config.get_value(ds_key_long, default)

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the config's value at a dotted key is ``"auto"`` (False when unset)."""
        return self.get_value(ds_key_long) == "auto"

    def fill_match(
        self, ds_key_long: str, mismatches: list[str] | None = None, must_match: bool = True, **kwargs: Any
    ) -> None:
        """Replace an ``"auto"`` at ``ds_key_long`` by ``kwargs[ds_key_long]``.

        An ``"auto"`` with no value in ``kwargs`` is an error naming the key. With ``must_match``, an explicit
        value that differs from ``kwargs[ds_key_long]`` is appended to ``mismatches`` (see
        :meth:`deepspeed_config_process`, which raises for them). Keys are dotted, so pass them as
        ``**{"zero_optimization.stage": 3}``.
        """
        node, key = self.hf_ds_config.find_config_node(ds_key_long)
        if node is None:
            return
        if node.get(key) == "auto":
            if ds_key_long not in kwargs:
                raise ConfigurationError(
                    f'the DeepSpeed config\'s {ds_key_long} is "auto" but no value was given for it; set it in the '
                    f"config or pass {ds_key_long}=..."
                )
            node[key] = kwargs[ds_key_long]
            return
        if must_match and mismatches is not None and node.get(key) is not None and ds_key_long in kwargs:
            if node[key] != kwargs[ds_key_long]:
                mismatches.append(f"{ds_key_long}: config {node[key]!r} vs given {kwargs[ds_key_long]!r}")

    def deepspeed_config_process(
        self,
        prefix: str = "",
        mismatches: list[str] | None = None,
        config: dict[str, Any] | None = None,
        must_match: bool = True,
        **kwargs: Any,
    ) -> None:
        """:meth:`fill_match` every entry of the config (``kwargs`` keyed by dotted keys); with ``must_match``,
        explicit values that differ from ``kwargs`` are one error listing them all."""
        top = mismatches is None
        mismatches = [] if mismatches is None else mismatches
        for key, value in list((self.deepspeed_config if config is None else config).items()):
            if isinstance(value, dict):
                self.deepspeed_config_process(f"{prefix}{key}.", mismatches, value, must_match, **kwargs)
            else:
                self.fill_match(f"{prefix}{key}", mismatches, must_match=must_match, **kwargs)
        if top and mismatches:
            raise ConfigurationError(
                f"DeepSpeed config values differ from the values given ({'; '.join(mismatches)}); make them agree "
                'or write "auto" in the config'
            )
        if top:
            self.hf_ds_config.set_stage_and_offload()

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Fill the config's precision sections for ``mixed_precision`` ("no", "fp16", "bf16"): a missing
        section is added, ``"enabled": "auto"`` is filled; the other 16-bit type enabled is an error. The
        backend does the same on its own copy at ``prepare``; this method changes the plugin's config."""
        if mixed_precision not in ("no", "fp16", "bf16", "fp8"):
            raise ConfigurationError(
                f"DeepSpeedPlugin.set_mixed_precision({mixed_precision!r}): expected 'no', 'fp16' or 'bf16'"
            )
        if mixed_precision == "fp8":
            raise ConfigurationError(
                "DeepSpeedPlugin.set_mixed_precision('fp8'): the deepspeed backend does not train in fp8 (Accelerate "
                "does it through MS-AMP, see enable_msamp); use 'bf16'"
            )
        config = self.deepspeed_config
        other = {"fp16": "bf16", "bf16": "fp16"}.get(mixed_precision)
        if other is not None and str(get_path(config, f"{other}.enabled", False)).lower() == "true":
            raise ConfigurationError(
                f"mixed_precision={mixed_precision!r} but the DeepSpeed config enables {other}; make them agree"
            )
        if mixed_precision == "fp16":
            config.setdefault("fp16", {"enabled": True, "auto_cast": True})
        elif mixed_precision == "bf16":
            config.setdefault("bf16", {"enabled": True})
        for dtype in ("fp16", "bf16"):
            config.setdefault(dtype, {"enabled": False})
        enabled: dict[str, Any] = {
            "fp16.enabled": mixed_precision == "fp16",
            "bf16.enabled": mixed_precision == "bf16",
        }
        self.fill_match("fp16.enabled", must_match=False, **enabled)
        self.fill_match("bf16.enabled", must_match=False, **enabled)

    def set_deepspeed_weakref(self) -> None:
        """Let transformers see this configuration (``is_deepspeed_zero3_enabled()``, ``deepspeed_config()``):
        ``from_pretrained``/``from_config`` then create ZeRO-3 models already partitioned. Needs transformers.

        Once an Accelerator runs the deepspeed backend, transformers sees its *active* plugin (selecting
        another plugin switches what it sees); before that, the plugin that called this method last."""
        from drivetrain_deepspeed.transformers_link import pin, register_with_transformers

        self.dschf = register_with_transformers(required=True)
        pin(self)

    def set_moe_leaf_modules(self, model: Any) -> list[Any]:
        """Flag the modules of ``transformer_moe_cls_names`` in ``model`` as ZeRO-3 leaf modules (done by
        ``prepare`` too); returns them. See drivetrain_deepspeed.moe."""
        from drivetrain_deepspeed.moe import set_moe_leaf_modules

        return set_moe_leaf_modules(model, self)

    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag) and self.stage == 3

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Inside the block ``zero3_init_flag`` is ``enable``; with ``enable`` (and ZeRO-3) parameters created
        there are partitioned across processes (``deepspeed.zero.Init``)."""
        from drivetrain_deepspeed.transformers_link import running_mixed_precision
        from drivetrain_deepspeed.zero_init import partitioned_init

        old = self.zero3_init_flag
        self.zero3_init_flag = enable
        try:
            with partitioned_init(self, running_mixed_precision(), enabled=enable):
                yield
        finally:
            self.zero3_init_flag = old

    @property
    def selected(self) -> bool:
        """Whether this plugin is the active one; change it with ``state.select_deepspeed_plugin(name)``."""
        return self._selected

    @selected.setter
    def selected(self, value: bool) -> None:
        raise AttributeError(
            "DeepSpeedPlugin.selected is read-only: select a plugin with "
            "accelerator.state.select_deepspeed_plugin(name)"
        )

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this plugin the active one. Called by ``state.select_deepspeed_plugin(name)``, which also
        unselects the others; called directly it is an error (as in Accelerate)."""
        if not _from_accelerator_state:
            raise ConfigurationError(
                "a DeepSpeedPlugin is selected with accelerator.state.select_deepspeed_plugin(name) (which unselects "
                "the others), not with plugin.select()"
            )
        self._selected = True
        if "transformers" in sys.modules:
            from drivetrain_deepspeed.transformers_link import keep_transformers_current

            keep_transformers_current()

    def _unselect(self) -> None:
        self._selected = False


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


# -- resolved by the kernel from the script, the launcher, Accelerate's variables and the config file -----------
#: Accelerate's ``ACCELERATE_DEEPSPEED_*`` variables (its launcher exports them) -> field.
ACCELERATE_VARIABLES = {
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": "hf_ds_config",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "zero_stage",
    "ACCELERATE_GRADIENT_CLIPPING": "gradient_clipping",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "offload_optimizer_device",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "offload_param_device",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH": "offload_optimizer_nvme_path",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH": "offload_param_nvme_path",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": "zero3_init_flag",
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "zero3_save_16bit_model",
    "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": "transformer_moe_cls_names",
}
#: What Accelerate writes for "not set" (a path or config file of ``none``, a clipping of ``auto``).
_UNSET = ("none", "auto")


def script_settings(plugin: DeepSpeedPlugin) -> dict[str, Any]:
    """The fields the script passed to ``plugin`` (before its DeepSpeed config filled the others)."""
    return dict(plugin._script_fields)


def parse_settings(raw: dict[str, Any], origin: str) -> dict[str, Any]:
    """Settings from a config file's ``deepspeed_config`` section, ``DRIVETRAIN_BACKEND_CONFIG`` or an
    ``ACCELERATE_DEEPSPEED_*`` variable, as the plugin holds them. Accepts the field names and Accelerate's
    keys (``deepspeed_config_file``, ``deepspeed_moe_layer_cls_names``); the multi-node launcher's keys are
    read by the launcher only."""
    fields = attrs.fields_dict(DeepSpeedPlugin)
    settings: dict[str, Any] = {}
    for key, value in raw.items():
        name = ACCELERATE_KEYS.get(key, key)
        if name in LAUNCHER_KEYS:
            continue
        if name not in fields or not fields[name].init:
            valid = (
                {field.name for field in fields.values() if field.init}
                | set(ACCELERATE_KEYS)
                | set(LAUNCHER_KEYS)
            )
            raise ConfigurationError(
                f"{origin}: unknown deepspeed setting {key!r}; valid: {', '.join(sorted(valid))}"
            )
        if value is None or isinstance(value, str) and value.strip().lower() in _UNSET:
            continue
        converter = fields[name].converter
        settings[name] = converter(value) if callable(converter) else value
    return settings


def variables() -> list[tuple[str, dict[str, Any]]]:
    """Accelerate's ``ACCELERATE_DEEPSPEED_*`` variables that are set, one source each."""
    return [
        (f"environment variable {variable}", {field: os.environ[variable]})
        for variable, field in ACCELERATE_VARIABLES.items()
        if os.environ.get(variable, "").strip()
    ]


def build(given: DeepSpeedPlugin | None, settings: dict[str, Any]) -> DeepSpeedPlugin:
    """The script's plugin with ``settings`` (fields it did not pass) added, or a plugin of ``settings`` alone.
    The script keeps its object: with settings to add it is rebuilt in place (its selection is kept)."""
    if given is None:
        return DeepSpeedPlugin(**settings)
    if not settings:
        return given
    rebuilt = DeepSpeedPlugin(**{**given._script_fields, **settings})
    for field in attrs.fields(DeepSpeedPlugin):
        if field.name not in ("_selected", "dschf", "_script_fields"):
            setattr(given, field.name, getattr(rebuilt, field.name))
    return given


#: How the kernel reads this backend's configuration (``plugin_api.resolve_backend_config``).
READER = BackendConfigReader(DeepSpeedPlugin, script_settings, parse_settings, build, variables)


def resolve_config(given: DeepSpeedPlugin | None) -> DeepSpeedPlugin:
    """``given`` (the script's plugin, or None) with the fields it leaves unset from the launcher, Accelerate's
    variables and the config file; a field set differently in two places is an error naming both. Resolved
    once per run by the kernel."""
    return resolve_backend_config(READER, given)


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
