"""``FullyShardedDataParallelPlugin``: what a user tells the fsdp backend, from code, launch flags or a
config file.

Sources: an object passed as ``Accelerator(fsdp_plugin=...)``; the JSON that ``drivetrain launch`` exports in
``DRIVETRAIN_BACKEND_CONFIG`` (its ``--fsdp_*`` flags and the config file's ``fsdp_config`` /
``backend_config`` section); the config file named by ``DRIVETRAIN_CONFIG_FILE`` when the script was not
started by ``drivetrain launch``. Keys may carry Accelerate's ``fsdp_`` prefix (``fsdp_sharding_strategy``)
and Accelerate's older names (``fsdp_offload_params``, ``fsdp_transformer_layer_cls_to_wrap``). A value
set both in code and in the environment must agree, or construction fails naming both.
"""

from __future__ import annotations

import enum
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import torch

from drivetrain.plugin_api import ConfigurationError, backend_settings, to_bool

#: Accelerate's switch for RAM-efficient loading (set by ``enable_fsdp_ram_efficient_loading``).
RAM_EFFICIENT_LOADING_ENV = "FSDP_CPU_RAM_EFFICIENT_LOADING"


class _NamedEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str(self.value)


class ShardingStrategy(_NamedEnum):
    """FSDP1's strategy names; see docs/fsdp.md for what each becomes under FSDP2."""

    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"
    HYBRID_SHARD_ZERO2 = "HYBRID_SHARD_ZERO2"


class StateDictType(_NamedEnum):
    FULL_STATE_DICT = "FULL_STATE_DICT"
    SHARDED_STATE_DICT = "SHARDED_STATE_DICT"


class AutoWrapPolicy(_NamedEnum):
    TRANSFORMER_BASED_WRAP = "TRANSFORMER_BASED_WRAP"
    SIZE_BASED_WRAP = "SIZE_BASED_WRAP"
    NO_WRAP = "NO_WRAP"


class BackwardPrefetch(_NamedEnum):
    BACKWARD_PRE = "BACKWARD_PRE"
    BACKWARD_POST = "BACKWARD_POST"
    NO_PREFETCH = "NO_PREFETCH"


def _enum_converter(enum_class: type[_NamedEnum], field_name: str) -> Callable[[Any], Any]:
    """Accept a member, its name in any case, or its 1-based number (Accelerate's questionnaire wrote those)."""
    members = list(enum_class)

    def convert(value: Any) -> Any:
        if isinstance(value, enum_class):
            return value
        text = str(value).strip()
        if text.isdigit() and 1 <= int(text) <= len(members):
            return members[int(text) - 1]
        for member in members:
            if text.upper() == member.value:
                return member
        raise ConfigurationError(
            f"FullyShardedDataParallelPlugin.{field_name}={value!r} is not valid; choose one of: "
            f"{', '.join(member.value for member in members)}"
        )

    return convert


def _optional(converter: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else converter(value)


def _to_bool(field_name: str) -> Callable[[Any], bool]:
    def convert(value: Any) -> bool:
        try:
            return to_bool(value)
        except ConfigurationError:
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.{field_name} must be true or false, got {value!r}"
            ) from None

    return convert


def _to_int(field_name: str, minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not str(value).strip().lstrip("-").isdigit():
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.{field_name} must be an integer, got {value!r}"
            )
        number = int(str(value).strip())
        if number < minimum:
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.{field_name} must be >= {minimum}, got {value!r}"
            )
        return number

    return convert


def _reshard_after_forward(value: Any) -> bool | int | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ConfigurationError(
        f"FullyShardedDataParallelPlugin.reshard_after_forward must be true, false or a positive number of "
        f"ranks to reshard to, got {value!r}"
    )


def _class_names(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    names = []
    for item in value:
        if isinstance(item, type):
            names.append(item.__name__)
        elif isinstance(item, str) and item.strip():
            names.append(item.strip())
        else:
            raise ConfigurationError(
                "FullyShardedDataParallelPlugin.transformer_cls_names_to_wrap takes class names (a list or a "
                f"comma-separated string) or classes, got item {item!r}"
            )
    return names


def _auto_wrap_policy(value: Any) -> Any:
    if value is None or callable(value) and not isinstance(value, (str, _NamedEnum)):
        return value
    return _enum_converter(AutoWrapPolicy, "auto_wrap_policy")(value)


_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "no": None,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def _dtype(value: Any, field_name: str) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    key = str(value).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ConfigurationError(
            f"FullyShardedDataParallelPlugin.mixed_precision_policy {field_name}={value!r} is not a dtype; use "
            "bf16, fp16 or fp32 (or a torch.dtype)"
        )
    return _DTYPES[key]


def _mixed_precision_policy(value: Any) -> Any:
    """A ``MixedPrecisionPolicy``, a dtype name (``"bf16"``: parameters and gradient reduction in bf16) or a
    dict of MixedPrecisionPolicy fields with dtype names."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    if isinstance(value, (str, torch.dtype)):
        dtype = _dtype(value, "dtype")
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    if isinstance(value, dict):
        allowed = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.mixed_precision_policy has unknown key(s) {', '.join(unknown)}; "
                f"valid keys: {', '.join(allowed)}"
            )
        kwargs = {key: _dtype(item, key) for key, item in value.items() if key != "cast_forward_inputs"}
        if "cast_forward_inputs" in value:
            kwargs["cast_forward_inputs"] = to_bool(value["cast_forward_inputs"])
        return MixedPrecisionPolicy(**kwargs)
    raise ConfigurationError(
        "FullyShardedDataParallelPlugin.mixed_precision_policy must be a torch.distributed.fsdp."
        f"MixedPrecisionPolicy, a dtype name (bf16, fp16, fp32) or a dict of its fields, got {value!r}"
    )


def _cpu_offload(value: Any) -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy

    if isinstance(value, CPUOffloadPolicy):
        return value
    return _to_bool("cpu_offload")(value)


def _ignored_modules(value: Any) -> Any:
    """Modules, or a regular expression matched against module names (``"lm_head|.*router"``)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.ignored_modules={value!r} is not a valid regular expression: {exc}"
            ) from None
        return value
    modules = list(value)
    if not all(isinstance(module, torch.nn.Module) for module in modules):
        raise ConfigurationError(
            "FullyShardedDataParallelPlugin.ignored_modules takes a list of modules or a regular expression "
            "matched against module names"
        )
    return modules


def _fsdp_version(value: Any) -> int:
    version = _to_int("fsdp_version", 1)(value)
    if version == 1:
        raise ConfigurationError(
            "FullyShardedDataParallelPlugin.fsdp_version=1 is not supported: drivetrain-fsdp is built on FSDP2 "
            "(torch.distributed.fsdp.fully_shard). Use fsdp_version=2; the FSDP1 settings map onto it as "
            "docs/fsdp.md shows"
        )
    if version != 2:
        raise ConfigurationError(f"FullyShardedDataParallelPlugin.fsdp_version must be 2, got {value!r}")
    return version


def _env_ram_efficient_loading() -> bool:
    return to_bool(os.environ.get(RAM_EFFICIENT_LOADING_ENV, "false"))


@attrs.define
class FullyShardedDataParallelPlugin:
    """Settings of the fsdp backend. Pass it as ``Accelerator(fsdp_plugin=...)`` (or ``backend_config=``).

    Every field has the meaning of Accelerate's plugin of the same name; docs/fsdp.md says what each
    becomes under FSDP2.
    """

    #: The kernel selects the backend from a configuration object's ``backend_name``.
    backend_name = "fsdp"

    sharding_strategy: ShardingStrategy = attrs.field(
        default=ShardingStrategy.FULL_SHARD, converter=_enum_converter(ShardingStrategy, "sharding_strategy")
    )
    #: FSDP2's own knob; None derives it from ``sharding_strategy``; an int reshards to that many ranks.
    reshard_after_forward: bool | int | None = attrs.field(default=None, converter=_reshard_after_forward)
    #: HYBRID_SHARD: processes in one shard group (default: the processes on one machine).
    hybrid_shard_size: int | None = attrs.field(
        default=None, converter=_optional(_to_int("hybrid_shard_size", 1))
    )
    auto_wrap_policy: Any = attrs.field(default=None, converter=_auto_wrap_policy)
    transformer_cls_names_to_wrap: list[str] = attrs.field(factory=list, converter=_class_names)
    min_num_params: int = attrs.field(default=0, converter=_to_int("min_num_params", 0))
    mixed_precision_policy: Any = attrs.field(default=None, converter=_mixed_precision_policy)
    cpu_offload: Any = attrs.field(default=False, converter=_cpu_offload)
    activation_checkpointing: bool = attrs.field(
        default=False, converter=_to_bool("activation_checkpointing")
    )
    #: None reads FSDP_CPU_RAM_EFFICIENT_LOADING (see enable_fsdp_ram_efficient_loading).
    cpu_ram_efficient_loading: bool | None = attrs.field(
        default=None, converter=_optional(_to_bool("cpu_ram_efficient_loading"))
    )
    state_dict_type: StateDictType = attrs.field(
        default=StateDictType.SHARDED_STATE_DICT, converter=_enum_converter(StateDictType, "state_dict_type")
    )
    ignored_modules: Any = attrs.field(default=None, converter=_ignored_modules)
    #: None: true exactly when cpu_ram_efficient_loading is on.
    sync_module_states: bool | None = attrs.field(
        default=None, converter=_optional(_to_bool("sync_module_states"))
    )
    #: FSDP2 always exposes the original parameters; False is accepted for Accelerate configs and warned about.
    use_orig_params: bool = attrs.field(default=True, converter=_to_bool("use_orig_params"))
    backward_prefetch: BackwardPrefetch = attrs.field(
        default=BackwardPrefetch.BACKWARD_PRE,
        converter=_enum_converter(BackwardPrefetch, "backward_prefetch"),
    )
    forward_prefetch: bool = attrs.field(default=False, converter=_to_bool("forward_prefetch"))
    fsdp_version: int = attrs.field(default=2, converter=_fsdp_version)

    def __attrs_post_init__(self) -> None:
        # Derived values stay None in the fields (see the properties below), so that evolve() and the merge
        # with the environment see what the user set, not what was derived from it.
        if self.cpu_ram_efficient_loading_enabled and self.sync_module_states is False:
            raise ConfigurationError(
                "FullyShardedDataParallelPlugin.cpu_ram_efficient_loading=True needs sync_module_states=True: only "
                "rank 0 holds the weights and they reach the other ranks by broadcast"
            )
        if self.reshard_after_forward not in (None, False) and self.sharding_strategy in (
            ShardingStrategy.SHARD_GRAD_OP,
            ShardingStrategy.HYBRID_SHARD_ZERO2,
        ):
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin: sharding_strategy={self.sharding_strategy.value} keeps parameters "
                f"gathered after forward, but reshard_after_forward={self.reshard_after_forward!r}; set only one"
            )
        if self.auto_wrap_policy == AutoWrapPolicy.SIZE_BASED_WRAP and self.min_num_params <= 0:
            raise ConfigurationError(
                "FullyShardedDataParallelPlugin.auto_wrap_policy=SIZE_BASED_WRAP needs min_num_params > 0"
            )
        if self.hybrid_shard_size is not None and not self.is_hybrid:
            raise ConfigurationError(
                "FullyShardedDataParallelPlugin.hybrid_shard_size only applies to sharding_strategy HYBRID_SHARD or "
                f"HYBRID_SHARD_ZERO2, not {self.sharding_strategy.value}"
            )
        if not self.use_orig_params:
            warnings.warn(
                "FullyShardedDataParallelPlugin.use_orig_params=False has no effect: FSDP2 always keeps the "
                "original parameters (sharded per parameter)",
                UserWarning,
                stacklevel=3,
            )

    @property
    def cpu_ram_efficient_loading_enabled(self) -> bool:
        if self.cpu_ram_efficient_loading is None:
            return _env_ram_efficient_loading()
        return self.cpu_ram_efficient_loading

    @property
    def sync_module_states_enabled(self) -> bool:
        if self.sync_module_states is None:
            return self.cpu_ram_efficient_loading_enabled
        return self.sync_module_states

    @property
    def effective_reshard_after_forward(self) -> bool | int:
        """FSDP2's ``reshard_after_forward``: the field, else true for FULL_SHARD / HYBRID_SHARD."""
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.sharding_strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)

    # -- what the wrapping code asks -----------------------------------------------------------------------
    @property
    def is_hybrid(self) -> bool:
        return self.sharding_strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy.HYBRID_SHARD_ZERO2)

    def resolved_auto_wrap_policy(self, model: torch.nn.Module) -> Any:
        """The policy to apply to ``model``: the field when set, else by class names (the field or the model's
        ``_no_split_modules``), else by size when ``min_num_params`` is set, else no wrapping below the root."""
        if self.auto_wrap_policy is not None:
            return self.auto_wrap_policy
        if self.transformer_cls_names_to_wrap or getattr(model, "_no_split_modules", None):
            return AutoWrapPolicy.TRANSFORMER_BASED_WRAP
        if self.min_num_params > 0:
            return AutoWrapPolicy.SIZE_BASED_WRAP
        return AutoWrapPolicy.NO_WRAP


# -- building from the environment ---------------------------------------------------------------------------
FIELD_NAMES = tuple(field.name for field in attrs.fields(FullyShardedDataParallelPlugin))
#: Accelerate's config keys (after the ``fsdp_`` prefix is removed) whose field has another name.
ALIASES = {
    "offload_params": "cpu_offload",
    "transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
    "backward_prefetch_policy": "backward_prefetch",
    "mixed_precision": "mixed_precision_policy",
    "version": "fsdp_version",
}


def _field_name(key: str, origin: str) -> str:
    name = key[len("fsdp_") :] if key.startswith("fsdp_") and key != "fsdp_version" else key
    name = ALIASES.get(name, name)
    if name not in FIELD_NAMES:
        raise ConfigurationError(
            f"{origin}: unknown fsdp setting {key!r}; valid settings (optionally prefixed with fsdp_): "
            f"{', '.join(FIELD_NAMES)}"
        )
    return name


def environment_settings() -> tuple[str | None, dict[str, Any]]:
    """(where they come from, fsdp settings by field name) from the launcher's flags or the config file's
    ``fsdp_config`` (Accelerate format) / ``backend_config`` (drivetrain format) section."""
    origin, values = backend_settings("fsdp")
    if origin is None:
        return None, {}
    return origin, {_field_name(str(key), origin): value for key, value in values.items()}


def from_environment() -> FullyShardedDataParallelPlugin:
    """The plugin a script gets when it passes no configuration object."""
    origin, values = environment_settings()
    try:
        return FullyShardedDataParallelPlugin(**values)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{origin}: {exc}") from None


def merged_with_environment(config: FullyShardedDataParallelPlugin) -> FullyShardedDataParallelPlugin:
    """``config`` with the environment's settings for fields the script left at their default; a field
    set differently in both places is an error naming both."""
    origin, values = environment_settings()
    if not values:
        return config
    defaults = FullyShardedDataParallelPlugin()
    converted = attrs.asdict(from_environment(), recurse=False)
    changes = {}
    for name in values:
        ours, theirs = getattr(config, name), converted[name]
        if ours == theirs:
            continue
        if ours == getattr(defaults, name):
            changes[name] = theirs
        else:
            raise ConfigurationError(
                f"conflicting fsdp setting {name!r}: FullyShardedDataParallelPlugin({name}={ours!r}) in the script "
                f"but {theirs!r} from {origin}; remove one of them or make them agree"
            )
    return attrs.evolve(config, **changes) if changes else config


def enable_fsdp_ram_efficient_loading() -> None:
    """Make plugins built from now on load weights on rank 0 only (sets FSDP_CPU_RAM_EFFICIENT_LOADING)."""
    os.environ[RAM_EFFICIENT_LOADING_ENV] = "true"


def disable_fsdp_ram_efficient_loading() -> None:
    """Undo :func:`enable_fsdp_ram_efficient_loading`."""
    os.environ[RAM_EFFICIENT_LOADING_ENV] = "false"
