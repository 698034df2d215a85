"""What a user can tell the ddp backend: ``DistributedDataParallelKwargs`` and the communication hooks.

Only the fields a user changed reach ``torch.nn.parallel.DistributedDataParallel`` (``to_kwargs()``), so
torch's defaults stay in charge of the rest. The three ``comm_*`` fields are not DDP constructor arguments:
they choose a gradient communication hook that :func:`register_comm_hook` installs after wrapping.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import attrs

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.settings import KwargsHandler


class DDPCommunicationHookType(str, enum.Enum):
    """How DDP communicates gradients (``comm_hook``) or compresses them around another hook
    (``comm_wrapper``). Members compare equal to their value: ``DDPCommunicationHookType.FP16 == "fp16"``."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"

    def __str__(self) -> str:
        return str(self.value)


#: Hooks that keep a ``PowerSGDState`` (which ``comm_state_option`` configures).
POWER_SGD_HOOKS = (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
#: What ``comm_wrapper`` accepts: a wrapper compresses what the wrapped hook sends.
WRAPPER_TYPES = (DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16)
#: The fields that configure the hook rather than the DDP constructor.
COMM_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


def _hook_type(field_name: str, allowed: tuple[DDPCommunicationHookType, ...]) -> Any:
    """Converter: accept a member or its string value (any case), reject the rest naming the field."""

    def convert(value: Any) -> DDPCommunicationHookType:
        if isinstance(value, DDPCommunicationHookType) and value in allowed:
            return value
        if isinstance(value, str):
            for member in allowed:
                if value.lower() in (member.value, member.name.lower()):
                    return member
        raise ConfigurationError(
            f"DistributedDataParallelKwargs.{field_name}={value!r} is not valid; choose one of: "
            f"{', '.join(member.value for member in allowed)} (or the DDPCommunicationHookType members)"
        )

    return convert


def _instance_of(kind: type | tuple[type, ...], description: str) -> Any:
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        # bool is an int in Python; a flag given where a number is expected is almost surely a mistake.
        wrong_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
        if not isinstance(value, kind) or wrong_bool:
            raise ConfigurationError(
                f"DistributedDataParallelKwargs.{attribute.name} must be {description}, got {value!r}"
            )

    return check


def _positive_number(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    _instance_of((int, float), "a number of megabytes")(instance, attribute, value)
    if value <= 0:
        raise ConfigurationError(f"DistributedDataParallelKwargs.{attribute.name} must be > 0, got {value!r}")


def _state_options(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ConfigurationError(
            f"DistributedDataParallelKwargs.comm_state_option must be a dict of PowerSGDState options "
            f"(e.g. {{'matrix_approximation_rank': 2}}), got {value!r}"
        )


_flag = _instance_of(bool, "True or False")


@attrs.define
class DistributedDataParallelKwargs(KwargsHandler):
    """Options for ``torch.nn.parallel.DistributedDataParallel`` and its gradient communication hook.

    Pass it in ``Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(...)])``. The DDP fields have
    torch's meaning (see the torch documentation); ``comm_hook`` replaces the plain all-reduce,
    ``comm_wrapper`` compresses what that hook sends (fp16/bf16), and ``comm_state_option`` holds
    ``PowerSGDState`` options for the PowerSGD hooks.
    """

    dim: int = attrs.field(default=0, validator=_instance_of(int, "an integer (the batch dimension)"))
    broadcast_buffers: bool = attrs.field(default=True, validator=_flag)
    bucket_cap_mb: float = attrs.field(default=25, validator=_positive_number)
    find_unused_parameters: bool = attrs.field(default=False, validator=_flag)
    check_reduction: bool = attrs.field(default=False, validator=_flag)
    gradient_as_bucket_view: bool = attrs.field(default=False, validator=_flag)
    static_graph: bool = attrs.field(default=False, validator=_flag)
    comm_hook: DDPCommunicationHookType = attrs.field(
        default=DDPCommunicationHookType.NO,
        converter=_hook_type("comm_hook", tuple(DDPCommunicationHookType)),
    )
    comm_wrapper: DDPCommunicationHookType = attrs.field(
        default=DDPCommunicationHookType.NO, converter=_hook_type("comm_wrapper", WRAPPER_TYPES)
    )
    comm_state_option: dict[str, Any] = attrs.field(factory=dict, validator=_state_options)

    def __attrs_post_init__(self) -> None:
        if self.comm_wrapper != DDPCommunicationHookType.NO and self.comm_hook == DDPCommunicationHookType.NO:
            raise ConfigurationError(
                f"DistributedDataParallelKwargs.comm_wrapper={self.comm_wrapper.value!r} wraps a communication "
                "hook, but comm_hook is 'no'; choose a comm_hook (e.g. 'power_sgd') or drop comm_wrapper"
            )
        if self.comm_state_option and self.comm_hook not in POWER_SGD_HOOKS:
            raise ConfigurationError(
                f"DistributedDataParallelKwargs.comm_state_option is only used by the PowerSGD hooks, but "
                f"comm_hook={self.comm_hook.value!r}; set comm_hook to 'power_sgd' or 'batched_power_sgd' or drop it"
            )
        if self.comm_state_option:
            _check_power_sgd_options(self.comm_state_option)

    def to_kwargs(self) -> dict[str, Any]:
        """Non-default DDP constructor arguments (the ``comm_*`` fields are applied after wrapping)."""
        return {name: value for name, value in super().to_kwargs().items() if name not in COMM_FIELDS}

    def register_comm_hook(self, model: Any) -> None:
        """Install the chosen communication hook on a ``DistributedDataParallel`` model (no-op for ``no``)."""
        register_comm_hook(model, self.comm_hook, self.comm_wrapper, self.comm_state_option)


def _check_power_sgd_options(options: dict[str, Any]) -> None:
    """Reject option names that ``PowerSGDState`` does not take, when the config is built."""
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    accepted = [
        name
        for name in inspect.signature(PowerSGDState.__init__).parameters
        if name not in ("self", "process_group")
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigurationError(
            f"DistributedDataParallelKwargs.comm_state_option has unknown option(s) {', '.join(unknown)}; "
            f"PowerSGDState accepts: {', '.join(accepted)}"
        )


def register_comm_hook(
    model: Any,
    hook_type: DDPCommunicationHookType,
    wrapper_type: DDPCommunicationHookType = DDPCommunicationHookType.NO,
    state_options: dict[str, Any] | None = None,
) -> None:
    """Replace DDP's plain all-reduce on ``model`` by the hook ``hook_type``, wrapped by ``wrapper_type``."""
    if hook_type == DDPCommunicationHookType.NO:
        return
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    from drivetrain_ddp.comm_hooks import (
        bf16_compress_any_backend,
        bf16_compress_wrapper_any_backend,
        bf16_hooks_supported_by_torch,
        repair_batched_power_sgd,
    )

    hooks: dict[DDPCommunicationHookType, Callable[..., Any]] = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
        DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
        DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers: dict[DDPCommunicationHookType, Callable[..., Any]] = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
    }
    torch_backend = dist.get_backend(model.process_group)
    if torch_backend not in ("nccl", "xccl") or not bf16_hooks_supported_by_torch():
        # torch refuses its bf16 hooks outside NCCL/XCCL; ours do the same on any backend.
        hooks[DDPCommunicationHookType.BF16] = bf16_compress_any_backend
        wrappers[DDPCommunicationHookType.BF16] = bf16_compress_wrapper_any_backend
    hook = hooks[hook_type]
    if wrapper_type in wrappers:
        hook = wrappers[wrapper_type](hook)
    if hook_type == DDPCommunicationHookType.BATCHED_POWER_SGD:
        repair_batched_power_sgd()
    if hook_type in POWER_SGD_HOOKS:
        state: Any = powerSGD_hook.PowerSGDState(process_group=model.process_group, **(state_options or {}))
    else:
        # The default hooks take the process group as their state (None: the default group).
        state = model.process_group
    model.register_comm_hook(state=state, hook=hook)
