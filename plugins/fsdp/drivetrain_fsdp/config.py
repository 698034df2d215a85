"""``FullyShardedDataParallelPlugin``: what a user tells the fsdp backend, from code, launch flags or a
config file.

Sources (resolved by the kernel, ``plugin_api.resolve_backend_config``): an object passed as
``Accelerator(fsdp_plugin=...)``; the JSON that ``drivetrain launch`` exports in ``DRIVETRAIN_BACKEND_CONFIG``
(its ``--fsdp_*`` flags and the config file's ``fsdp_config`` / ``backend_config`` section); the config file
named by ``DRIVETRAIN_CONFIG_FILE``. Keys may carry Accelerate's ``fsdp_`` prefix (``fsdp_sharding_strategy``)
and Accelerate's older names (``fsdp_offload_params``, ``fsdp_transformer_layer_cls_to_wrap``). A field set in
two places must agree, or resolution fails naming both values.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import torch

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.settings import BackendConfigReader, to_bool
from drivetrain_fsdp.enums import (  # re-exported: users import them from here
    AutoWrapPolicy,
    BackwardPrefetch,
    ShardingStrategy,
    StateDictType,
    _NamedEnum,
)

#: Accelerate's switch for RAM-efficient loading (set by ``enable_fsdp_ram_efficient_loading``).
RAM_EFFICIENT_LOADING_ENV = "FSDP_CPU_RAM_EFFICIENT_LOADING"


def _enum_converter(enum_class: type[_NamedEnum], field_name: str) -> Callable[[Any], Any]:
    """Accept a member, its name in any case, or its 1-based number (Accelerate's questionnaire wrote those)."""
    members = list(enum_class)

    def convert(value: Any) -> Any:
        if isinstance(value, enum_class):
            return value
        # torch's own enum (torch.distributed.fsdp.ShardingStrategy.FULL_SHARD) is taken by its member name
        text = value.name if isinstance(value, enum.Enum) else str(value).strip()
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
    return lambda value: to_bool(value, f"FullyShardedDataParallelPlugin.{field_name}")


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


def _reshard_after_forward(value: Any) -> bool | int | ShardingStrategy | None:
    """A bool, a number of ranks, or a sharding strategy name (Accelerate's FSDP1 configs write
    ``fsdp_reshard_after_forward: FULL_SHARD``; the plugin moves it to ``sharding_strategy``)."""
    if value is None or isinstance(value, (bool, ShardingStrategy)):
        return value
    text = str(value).strip().lower()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    if text.upper() in ShardingStrategy.__members__:
        return ShardingStrategy(text.upper())
    with contextlib.suppress(ConfigurationError):
        return to_bool(text)
    raise ConfigurationError(
        f"FullyShardedDataParallelPlugin.reshard_after_forward must be true, false, a positive number of "
        f"ranks to reshard to or a sharding strategy name, got {value!r}"
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
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    if value is None or isinstance(value, (MixedPrecisionPolicy, MixedPrecision)):
        return value
    if isinstance(value, (str, torch.dtype)):
        dtype = _dtype(value, "dtype")
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    if isinstance(value, dict):
        # buffer_dtype is FSDP1's (MixedPrecision); the plugin builds that class when fsdp_version=1.
        allowed = ("param_dtype", "reduce_dtype", "output_dtype", "buffer_dtype", "cast_forward_inputs")
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.mixed_precision_policy has unknown key(s) {', '.join(unknown)}; "
                f"valid keys: {', '.join(allowed)}"
            )
        kwargs: dict[str, Any] = {
            key: _dtype(item, key) for key, item in value.items() if key != "cast_forward_inputs"
        }
        if "cast_forward_inputs" in value:
            kwargs["cast_forward_inputs"] = to_bool(
                value["cast_forward_inputs"],
                "FullyShardedDataParallelPlugin.mixed_precision_policy cast_forward_inputs",
            )
        if "buffer_dtype" in kwargs:
            return MixedPrecision(**kwargs)
        return MixedPrecisionPolicy(**kwargs)
    raise ConfigurationError(
        "FullyShardedDataParallelPlugin.mixed_precision_policy must be a torch.distributed.fsdp."
        f"MixedPrecisionPolicy, a dtype name (bf16, fp16, fp32) or a dict of its fields, got {value!r}"
    )


def _cpu_offload(value: Any) -> Any:
    """A bool, FSDP2's ``OffloadPolicy`` / ``CPUOffloadPolicy`` or FSDP1's ``CPUOffload``."""
    from torch.distributed.fsdp import CPUOffload, OffloadPolicy

    if isinstance(value, (OffloadPolicy, CPUOffload)):
        return value
    return _to_bool("cpu_offload")(value)


def _param_init_fn(value: Any) -> Any:
    if value is not None and not callable(value):
        raise ConfigurationError(
            f"FullyShardedDataParallelPlugin.param_init_fn must be a callable module -> None, got {value!r}"
        )
    return value


def _state_dict_config(field_name: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        from torch.distributed.fsdp import OptimStateDictConfig, StateDictConfig

        expected = OptimStateDictConfig if field_name.startswith("optim") else StateDictConfig
        if value is not None and not isinstance(value, expected):
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.{field_name} must be a torch.distributed.fsdp.{expected.__name__} "
                f"(Full... or Sharded...), got {type(value).__name__}"
            )
        return value

    return convert


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
    if version not in (1, 2):
        raise ConfigurationError(
            f"FullyShardedDataParallelPlugin.fsdp_version must be 1 (FullyShardedDataParallel) or 2 (fully_shard), "
            f"got {value!r}"
        )
    return version


def _env_ram_efficient_loading() -> bool:
    return to_bool(
        os.environ.get(RAM_EFFICIENT_LOADING_ENV) or "false",
        f"environment variable {RAM_EFFICIENT_LOADING_ENV}",
    )


@attrs.define
class FullyShardedDataParallelPlugin:
    """Settings of the fsdp backend. Pass it as ``Accelerator(fsdp_plugin=...)`` (or ``backend_config=``).

    Every field and method has the meaning of Accelerate's plugin of the same name; docs/fsdp.md says what
    each becomes under FSDP2 (``fsdp_version=2``, the default) and FSDP1 (``fsdp_version=1``, torch's
    ``FullyShardedDataParallel``).
    """

    #: The kernel selects the backend from a configuration object's ``backend_name``.
    backend_name = "fsdp"

    sharding_strategy: ShardingStrategy = attrs.field(
        default=ShardingStrategy.FULL_SHARD, converter=_enum_converter(ShardingStrategy, "sharding_strategy")
    )
    #: FSDP2's own knob; None derives it from ``sharding_strategy``; an int reshards to that many ranks; a
    #: strategy name (Accelerate's FSDP1 configs) is moved to ``sharding_strategy``.
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
    #: With activation checkpointing, keep what each checkpointed unit saves for its recompute in host memory
    #: (FSDP2 only, as in Accelerate).
    activation_checkpointing_offload: bool = attrs.field(
        default=False, converter=_to_bool("activation_checkpointing_offload")
    )
    #: None reads FSDP_CPU_RAM_EFFICIENT_LOADING (see enable_fsdp_ram_efficient_loading).
    cpu_ram_efficient_loading: bool | None = attrs.field(
        default=None, converter=_optional(_to_bool("cpu_ram_efficient_loading"))
    )
    #: None: SHARDED_STATE_DICT with FSDP2, FULL_STATE_DICT with FSDP1 (Accelerate's defaults).
    state_dict_type: StateDictType | None = attrs.field(
        default=None, converter=_optional(_enum_converter(StateDictType, "state_dict_type"))
    )
    #: FSDP1's state dict configuration objects; None derives them from ``state_dict_type`` (full: gathered to
    #: rank 0 on CPU; sharded: on CPU). Under FSDP2 their ``offload_to_cpu`` is what counts.
    state_dict_config: Any = attrs.field(default=None, converter=_state_dict_config("state_dict_config"))
    optim_state_dict_config: Any = attrs.field(
        default=None, converter=_state_dict_config("optim_state_dict_config")
    )
    ignored_modules: Any = attrs.field(default=None, converter=_ignored_modules)
    #: None: true exactly when cpu_ram_efficient_loading is on.
    sync_module_states: bool | None = attrs.field(
        default=None, converter=_optional(_to_bool("sync_module_states"))
    )
    #: How a rank materialises modules it holds on the meta device (``module -> None``); None: ``to_empty`` on
    #: the device. Used by FSDP1, and by FSDP2 when ``sync_module_states`` broadcasts rank 0's weights.
    param_init_fn: Any = attrs.field(default=None, converter=_param_init_fn)
    #: FSDP2 always exposes the original parameters; False is accepted for Accelerate configs and warned about
    #: (with FSDP1 it is passed on).
    use_orig_params: bool = attrs.field(default=True, converter=_to_bool("use_orig_params"))
    backward_prefetch: BackwardPrefetch = attrs.field(
        default=BackwardPrefetch.BACKWARD_PRE,
        converter=_enum_converter(BackwardPrefetch, "backward_prefetch"),
    )
    forward_prefetch: bool = attrs.field(default=False, converter=_to_bool("forward_prefetch"))
    #: FSDP1: throttle in-flight all-gathers (FSDP2 always does, through its own stream synchronisation).
    limit_all_gathers: bool = attrs.field(default=True, converter=_to_bool("limit_all_gathers"))
    fsdp_version: int = attrs.field(default=2, converter=_fsdp_version)
    #: Fields this object derived rather than received (re-derived when what they derive from changes).
    _derived: set[str] = attrs.field(init=False, factory=set, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # Other derived values stay None in the fields (see the properties below), so that evolve() and the
        # merge with the environment see what the user set, not what was derived from it.
        if isinstance(self.reshard_after_forward, ShardingStrategy):
            # Accelerate's FSDP1 configs name the strategy under reshard_after_forward.
            strategy, self.reshard_after_forward = self.reshard_after_forward, None
            if self.sharding_strategy not in (ShardingStrategy.FULL_SHARD, strategy):
                raise ConfigurationError(
                    f"FullyShardedDataParallelPlugin: reshard_after_forward={strategy.value} but sharding_strategy="
                    f"{self.sharding_strategy.value}; set only one"
                )
            self.sharding_strategy = strategy
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
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ConfigurationError(
                "FullyShardedDataParallelPlugin.activation_checkpointing_offload=True needs "
                "activation_checkpointing=True"
            )
        if self.activation_checkpointing_offload and self.fsdp_version != 2:
            raise ConfigurationError(
                "FullyShardedDataParallelPlugin.activation_checkpointing_offload=True needs fsdp_version=2"
            )
        if self.fsdp_version == 1 and isinstance(self.reshard_after_forward, int):
            raise ConfigurationError(
                "FullyShardedDataParallelPlugin.reshard_after_forward is FSDP2's; with fsdp_version=1 choose "
                "sharding_strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2)"
            )
        if not self.use_orig_params and self.fsdp_version == 2:
            warnings.warn(
                "FullyShardedDataParallelPlugin.use_orig_params=False has no effect: FSDP2 always keeps the "
                "original parameters (sharded per parameter)",
                UserWarning,
                stacklevel=3,
            )
        self.set_cpu_offload()
        self.validate_cpu_offload()
        if self.mixed_precision_policy is not None:
            self.set_mixed_precision(self.mixed_precision_policy)
            self.validate_mixed_precision_policy()
        self.set_state_dict_type()

    # -- Accelerate's methods ------------------------------------------------------------------------------------
    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Set ``state_dict_type`` (e.g. switch to ``FULL_STATE_DICT`` for the final save) and derive the
        state dict configuration objects that were not given."""
        from torch.distributed.fsdp import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            ShardedOptimStateDictConfig,
            ShardedStateDictConfig,
        )

        if state_dict_type is not None:
            self.state_dict_type = state_dict_type
            self._derived.discard("state_dict_type")
        if self.state_dict_type is None or "state_dict_type" in self._derived:
            default = (
                StateDictType.FULL_STATE_DICT if self.fsdp_version == 1 else StateDictType.SHARDED_STATE_DICT
            )
            self.state_dict_type = default
            self._derived.add("state_dict_type")
        if self.state_dict_type == StateDictType.LOCAL_STATE_DICT:
            raise ConfigurationError(
                "FullyShardedDataParallelPlugin.state_dict_type=LOCAL_STATE_DICT is not supported (FSDP2 has no "
                "local state dict, as in Accelerate; drivetrain-fsdp refuses it with FSDP1 too): use "
                "SHARDED_STATE_DICT (reshardable) or FULL_STATE_DICT"
            )
        full = self.state_dict_type == StateDictType.FULL_STATE_DICT
        configs = {
            "state_dict_config": FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if full
            else ShardedStateDictConfig(offload_to_cpu=True),
            "optim_state_dict_config": FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if full
            else ShardedOptimStateDictConfig(offload_to_cpu=True),
        }
        for name, derived in configs.items():
            if getattr(self, name) is None or name in self._derived:
                setattr(self, name, derived)
                self._derived.add(name)

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Turn the wrap policy into the callable torch's FSDP1 takes (``module, recurse, nonwrapped_numel ->
        bool``), for ``model``: by class names (the field, else the model's ``_no_split_modules``) or by size.
        The backend's own wrapping reads the policy as configured; this is for scripts that wrap by hand."""
        import functools

        from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

        if callable(self.auto_wrap_policy) and not isinstance(self.auto_wrap_policy, AutoWrapPolicy):
            return
        from drivetrain_fsdp.units import modules_to_wrap

        chosen = {id(module) for module in modules_to_wrap(model, self, [])}
        if self.resolved_auto_wrap_policy(model) == AutoWrapPolicy.NO_WRAP:
            self.auto_wrap_policy = None
            return
        self.auto_wrap_policy = functools.partial(
            lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in chosen
        )

    def set_mixed_precision(
        self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False
    ) -> None:
        """Set the mixed precision policy from a precision name (``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp8"``
        computes in bf16) or dtype: parameters and gradient reduction in that dtype (``buffer_autocast`` keeps
        FSDP1's buffers fp32). A policy already set is kept unless ``override``; one given as a dict or a
        name becomes the class this ``fsdp_version`` takes."""
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        names = {"fp8": torch.bfloat16, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
        policy = self.mixed_precision_policy
        if override or policy is None:
            dtype = names.get(mixed_precision) if isinstance(mixed_precision, str) else mixed_precision
            if dtype not in names.values():
                raise ConfigurationError(
                    f"FullyShardedDataParallelPlugin.set_mixed_precision({mixed_precision!r}): choose one of "
                    f"{', '.join(names)} (or the torch dtype)"
                )
            if self.fsdp_version == 1:
                buffer = torch.float32 if buffer_autocast else dtype
                self.mixed_precision_policy = MixedPrecision(
                    param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=buffer
                )
            else:
                self.mixed_precision_policy = MixedPrecisionPolicy(
                    param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype
                )
            return
        # A policy of the other FSDP version's class carries over field by field.
        if self.fsdp_version == 1 and isinstance(policy, MixedPrecisionPolicy):
            self.mixed_precision_policy = MixedPrecision(
                param_dtype=policy.param_dtype,
                reduce_dtype=policy.reduce_dtype,
                buffer_dtype=policy.param_dtype,
                cast_forward_inputs=policy.cast_forward_inputs,
            )
        elif self.fsdp_version == 2 and isinstance(policy, MixedPrecision):
            self.mixed_precision_policy = MixedPrecisionPolicy(
                param_dtype=policy.param_dtype,
                reduce_dtype=policy.reduce_dtype,
                cast_forward_inputs=policy.cast_forward_inputs,
            )

    def validate_mixed_precision_policy(self) -> None:
        """Raise unless the policy is the class this ``fsdp_version`` takes (``MixedPrecisionPolicy`` for
        FSDP2, ``MixedPrecision`` for FSDP1)."""
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        expected = MixedPrecisionPolicy if self.fsdp_version == 2 else MixedPrecision
        if not isinstance(self.mixed_precision_policy, expected):
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.mixed_precision_policy must be a torch.distributed.fsdp."
                f"{expected.__name__} with fsdp_version={self.fsdp_version}, got "
                f"{type(self.mixed_precision_policy).__name__}"
            )

    def set_cpu_offload(self) -> None:
        """Turn a bool ``cpu_offload`` into the object this ``fsdp_version`` takes: FSDP2's
        ``CPUOffloadPolicy`` (``OffloadPolicy()`` for False), FSDP1's ``CPUOffload(offload_params=...)``."""
        from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

        value = self.cpu_offload
        if isinstance(value, bool):
            if self.fsdp_version == 1:
                self.cpu_offload = CPUOffload(offload_params=value)
            else:
                # Pinned host memory needs an accelerator; on a CPU-only machine it cannot be allocated.
                self.cpu_offload = (
                    CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if value else OffloadPolicy()
                )
        elif self.fsdp_version == 1 and isinstance(value, OffloadPolicy):
            self.cpu_offload = CPUOffload(offload_params=isinstance(value, CPUOffloadPolicy))
        elif self.fsdp_version == 2 and isinstance(value, CPUOffload):
            self.cpu_offload = (
                CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
                if value.offload_params
                else OffloadPolicy()
            )

    def validate_cpu_offload(self) -> None:
        """Raise unless ``cpu_offload`` is the object this ``fsdp_version`` takes."""
        from torch.distributed.fsdp import CPUOffload, OffloadPolicy

        expected = OffloadPolicy if self.fsdp_version == 2 else CPUOffload
        if not isinstance(self.cpu_offload, expected):
            raise ConfigurationError(
                f"FullyShardedDataParallelPlugin.cpu_offload must be a torch.distributed.fsdp.{expected.__name__} "
                f"with fsdp_version={self.fsdp_version}, got {self.cpu_offload!r}"
            )

    # -- derived values ------------------------------------------------------------------------------------------
    @property
    def offloads_params(self) -> bool:
        """Whether parameters (and gradients, and the optimizer step) live on the host."""
        from torch.distributed.fsdp import CPUOffloadPolicy

        return isinstance(self.cpu_offload, CPUOffloadPolicy) or bool(
            getattr(self.cpu_offload, "offload_params", False)
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
FIELD_NAMES = tuple(field.name for field in attrs.fields(FullyShardedDataParallelPlugin) if field.init)
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


def script_settings(config: FullyShardedDataParallelPlugin) -> dict[str, Any]:
    """The fields ``config`` sets: those that differ from a default plugin's, not counting the ones it derived."""
    defaults = FullyShardedDataParallelPlugin()
    return {
        name: getattr(config, name)
        for name in FIELD_NAMES
        if name not in config._derived and getattr(config, name) != getattr(defaults, name)
    }


def parse_settings(raw: dict[str, Any], origin: str) -> dict[str, Any]:
    """fsdp settings as the launcher's flags or a config file's ``fsdp_config`` (Accelerate format) /
    ``backend_config`` (drivetrain format) write them, as a plugin holds them: the keys given and what they
    changed (an FSDP1 strategy name under ``reshard_after_forward`` moves to ``sharding_strategy``)."""
    values = {_field_name(str(key), origin): value for key, value in raw.items()}
    built = FullyShardedDataParallelPlugin(**values)
    settings = script_settings(built)
    for name in values:
        if name not in built._derived and getattr(built, name) is not None:
            settings[name] = getattr(built, name)
    return settings


def build(
    given: FullyShardedDataParallelPlugin | None, settings: dict[str, Any]
) -> FullyShardedDataParallelPlugin:
    """The script's plugin with ``settings`` (fields it leaves at their defaults) added, or a plugin of
    ``settings`` alone. The script's own object when nothing is added."""
    if given is None:
        return FullyShardedDataParallelPlugin(**settings)
    if not settings:
        return given
    # What the script's object derived (state dict configs from its state_dict_type) is derived again.
    changes = {**settings, **{name: None for name in given._derived if name not in settings}}
    return attrs.evolve(given, **changes)


#: How the kernel reads this backend's configuration (``plugin_api.resolve_backend_config``).
READER = BackendConfigReader(FullyShardedDataParallelPlugin, script_settings, parse_settings, build)


def enable_fsdp_ram_efficient_loading() -> None:
    """Make plugins built from now on load weights on rank 0 only (sets FSDP_CPU_RAM_EFFICIENT_LOADING)."""
    os.environ[RAM_EFFICIENT_LOADING_ENV] = "true"


def disable_fsdp_ram_efficient_loading() -> None:
    """Undo :func:`enable_fsdp_ram_efficient_loading`."""
    os.environ[RAM_EFFICIENT_LOADING_ENV] = "false"
