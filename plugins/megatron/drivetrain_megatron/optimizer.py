"""megatron-core's optimizer (``megatron.core.optimizer.get_megatron_optimizer``) in place of the user's torch
optimizer, on CUDA for a model in megatron-core's DistributedDataParallel (the schedule path, schedule.py).

The user's optimizer only names the algorithm and its hyperparameters (translated by :func:`optimizer_config`);
megatron-core builds its own optimizer over the model chunk: torch's ``AdamW``/``Adam``/``SGD`` underneath
when neither TransformerEngine nor apex is installed, wrapped in its ``FP32Optimizer``, its bf16/fp16
``Float16OptimizerWithFloat16Params`` or, with ``use_distributed_optimizer=True``, its ``DistributedOptimizer``
(optimizer state sharded over the data-parallel group). It clips to ``gradient_clipping`` itself.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError
from drivetrain_megatron.config import MegatronLMPlugin

SUPPORTED = "torch.optim.AdamW, torch.optim.Adam or torch.optim.SGD"
#: Options of the user's optimizer megatron-core's optimizers have no equivalent for, with the value they need.
_UNSUPPORTED_OPTIONS = {
    "amsgrad": False,
    "maximize": False,
    "nesterov": False,
    "dampening": 0,
    "differentiable": False,
}


def _hyperparameters(optimizer: torch.optim.Optimizer) -> tuple[str, tuple[str, ...]]:
    """megatron-core's name for the algorithm of ``optimizer`` and the group keys that carry its settings."""
    if isinstance(optimizer, (torch.optim.AdamW, torch.optim.Adam)):
        return "adam", ("lr", "betas", "eps", "weight_decay")
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd", ("lr", "momentum", "weight_decay")
    raise ConfigurationError(
        f"MegatronLMPlugin: megatron-core's optimizer (used on CUDA with megatron-core's schedule or "
        f"use_distributed_optimizer=True) cannot stand in for {type(optimizer).__module__}."
        f"{type(optimizer).__qualname__}; pass {SUPPORTED} (its hyperparameters are carried over)"
    )


def optimizer_config(
    optimizer: torch.optim.Optimizer, config: MegatronLMPlugin, mixed_precision: str = "no"
) -> Any:
    """megatron-core's ``OptimizerConfig`` equivalent to ``optimizer`` (its lr, betas, eps, weight decay or
    momentum), clipping to ``config.gradient_clipping``, with the plugin's ``use_distributed_optimizer`` and
    the accelerator's mixed precision. Refuses what megatron-core's optimizer would compute differently."""
    from megatron.core.optimizer import OptimizerConfig

    name, keys = _hyperparameters(optimizer)
    kind = type(optimizer).__name__
    if config.use_distributed_optimizer and name != "adam":
        # megatron-core asserts this deep inside get_megatron_optimizer (seen on an H100 with SGD)
        raise ConfigurationError(
            f"MegatronLMPlugin.use_distributed_optimizer=True needs torch.optim.AdamW or torch.optim.Adam: "
            f"megatron-core's distributed optimizer supports only Adam (its checkpoint layout), not {kind}; "
            "use AdamW/Adam or set use_distributed_optimizer=False"
        )
    groups = optimizer.param_groups
    first = groups[0]
    for index, group in enumerate(groups[1:], start=1):
        for key in keys:
            if group.get(key) != first.get(key):
                raise ConfigurationError(
                    f"MegatronLMPlugin: {kind} parameter group {index} has {key}={group.get(key)!r} but group 0 "
                    f"has {first.get(key)!r}; megatron-core's optimizer takes one value per setting for the "
                    "whole model: use one parameter group (or equal settings in every group)"
                )
    for option, needed in _UNSUPPORTED_OPTIONS.items():
        if option in first and first[option] != needed:
            raise ConfigurationError(
                f"MegatronLMPlugin: {kind}({option}={first[option]!r}) has no equivalent in megatron-core's "
                f"optimizer; use {option}={needed!r}"
            )
    values: dict[str, Any] = {
        "optimizer": name,
        # the peak rate: an LR scheduler built on the optimizer may have set "lr" to its first (warm-up) rate
        "lr": float(first.get("initial_lr", first["lr"])),
        # megatron-core copies both into every param group, where MegatronLMDummyScheduler (its
        # OptimizerParamScheduler) reads them
        "min_lr": float(config.min_lr or 0.0),
        "weight_decay": float(first["weight_decay"]),
        "clip_grad": float(config.gradient_clipping or 0.0),
        "use_distributed_optimizer": bool(config.use_distributed_optimizer),
        "bf16": mixed_precision == "bf16",
        "fp16": mixed_precision == "fp16",
    }
    if name == "adam":
        beta1, beta2 = first["betas"]
        values.update(
            adam_beta1=float(beta1),
            adam_beta2=float(beta2),
            adam_eps=float(first["eps"]),
            # torch's AdamW decays the weights apart from the gradient; torch's Adam adds it to the gradient
            decoupled_weight_decay=isinstance(optimizer, torch.optim.AdamW)
            or bool(first.get("decoupled_weight_decay", False)),
        )
    else:
        values["sgd_momentum"] = float(first["momentum"])
    return OptimizerConfig(**values)


class MegatronCoreOptimizer:
    """megatron-core's optimizer behind the interface the kernel's ``AcceleratedOptimizer`` and torch's LR
    schedulers use: ``param_groups`` are megatron-core's own (a scheduler's ``lr`` reaches the optimizer that
    steps), ``step`` clips and updates, ``state_dict`` holds everything needed to resume (with the distributed
    optimizer: its shards gathered on data-parallel rank 0, a collective call on every rank)."""

    def __init__(self, megatron_optimizer: Any, defaults: dict[str, Any]) -> None:
        self.megatron_optimizer = megatron_optimizer
        self.defaults = dict(defaults)
        #: The gradient norm (before clipping) megatron-core computed at the last step.
        self.last_grad_norm: float | None = None
        self.step_was_skipped = False

    # -- torch's optimizer interface -------------------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.megatron_optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.megatron_optimizer.state

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        succeeded, grad_norm, _ = self.megatron_optimizer.step()
        self.step_was_skipped = not succeeded
        self.last_grad_norm = None if grad_norm is None else float(grad_norm)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.megatron_optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise ConfigurationError(
            "MegatronLMPlugin: megatron-core's optimizer builds its parameter groups from the model; "
            "add_param_group is not supported after prepare"
        )

    def _distributed_parts(self) -> list[Any]:
        return [
            part
            for part in getattr(self.megatron_optimizer, "chained_optimizers", [self.megatron_optimizer])
            if hasattr(part, "get_parameter_state_dp_zero")
        ]

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"optimizer": self.megatron_optimizer.state_dict()}
        parts = self._distributed_parts()
        if parts:
            # the optimizer's state tensors are sharded over data-parallel ranks: gathered on rank 0
            state["parameter_state"] = [part.get_parameter_state_dp_zero() for part in parts]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.megatron_optimizer.load_state_dict(state_dict["optimizer"])
        parts = self._distributed_parts()
        if parts:
            saved = state_dict.get("parameter_state")
            if saved is None or len(saved) != len(parts):
                raise ConfigurationError(
                    "MegatronLMPlugin(use_distributed_optimizer=True): the checkpoint's optimizer state was not "
                    "saved by the distributed optimizer; load it with the use_distributed_optimizer it was saved with"
                )
            # megatron-core scatters the gathered shards over gloo, from CPU tensors, and copies them into
            # views of the (leaf) model parameters: outside autograd
            with torch.no_grad():
                for part, part_state in zip(parts, saved):
                    # torch's Adam keeps a per-parameter "step" (restored above from the param groups) that
                    # the gathered shards do not carry, and megatron-core 0.16.1 copies every state key; it
                    # also restores one step tensor shared by all parameters, which torch's Adam would then
                    # advance once per parameter: each gets its own copy back
                    steps = {
                        key: entry.pop("step")
                        for key, entry in part.optimizer.state.items()
                        if "step" in entry
                    }
                    try:
                        part.load_parameter_state_from_dp_zero(_to_cpu(part_state))
                    finally:
                        for key, step in steps.items():
                            part.optimizer.state[key]["step"] = step.clone()

    def __repr__(self) -> str:
        return f"MegatronCoreOptimizer({type(self.megatron_optimizer).__name__})"


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value


def build(
    optimizer: torch.optim.Optimizer,
    model_chunk: torch.nn.Module,
    config: MegatronLMPlugin,
    mixed_precision: str,
) -> MegatronCoreOptimizer:
    """megatron-core's optimizer for ``model_chunk`` (megatron-core's DistributedDataParallel) with the
    settings of ``optimizer``, which must hold exactly the chunk's trainable parameters."""
    from megatron.core.optimizer import get_megatron_optimizer

    settings = optimizer_config(optimizer, config, mixed_precision)
    given = {id(parameter) for group in optimizer.param_groups for parameter in group["params"]}
    trainable = {id(parameter) for parameter in model_chunk.parameters() if parameter.requires_grad}
    if given != trainable:
        raise ConfigurationError(
            f"MegatronLMPlugin: the optimizer holds {len(given)} parameters but the prepared model has "
            f"{len(trainable)} trainable ones ({len(given & trainable)} in common); megatron-core's optimizer "
            "updates every trainable parameter of the model: build the optimizer from model.parameters() "
            "(freeze the others with requires_grad=False)"
        )
    # An empty override table: every parameter decays as in the user's optimizer (megatron-core's default
    # table would exempt biases and 1-D weights, which only its own LR scheduler applies).
    megatron_optimizer = get_megatron_optimizer(settings, [model_chunk], config_overrides={})
    return MegatronCoreOptimizer(megatron_optimizer, optimizer.defaults)
