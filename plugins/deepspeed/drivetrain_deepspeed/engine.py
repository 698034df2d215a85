"""Building DeepSpeed engines and the objects the kernel holds in their place.

``wrap_model`` returns the ``DeepSpeedEngine`` itself (an ``nn.Module``; ``accelerator.unwrap_model`` gives
back the user's module). The engine owns the optimizer step: ``accelerator.backward`` runs
``engine.backward`` and ``engine.step`` (which only updates on accumulation boundaries), so the optimizer and
scheduler objects the script holds step nothing themselves (see wrappers.py).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import attrs
import torch

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator
from drivetrain_deepspeed.autofill import fill_config, resolve_precision
from drivetrain_deepspeed.config import DeepSpeedPlugin
from drivetrain_deepspeed.dummies import DummyOptim
from drivetrain_deepspeed.library import check_precision_supported, import_deepspeed
from drivetrain_deepspeed.moe import set_moe_leaf_modules
from drivetrain_deepspeed.selection import get_active_deepspeed_plugin
from drivetrain_deepspeed.wrappers import DeepSpeedEngineWrapper, DeepSpeedOptimizerWrapper
from drivetrain_deepspeed.zero_init import partitioned_init


@attrs.define(eq=False)
class EngineRecord:
    """What the backend remembers about one engine it built."""

    engine: Any
    plugin: DeepSpeedPlugin
    config: dict[str, Any]
    #: the optimizer the user passed (torch optimizer or DummyOptim), None for an inference engine
    user_optimizer: Any = None
    #: grad norm computed before the last step, for engines whose optimizer does not record one
    last_grad_norm: torch.Tensor | None = None


#: Accelerator -> the engines prepared through it, in order.
_engines_by_accelerator: weakref.WeakKeyDictionary[Any, list[EngineRecord]] = weakref.WeakKeyDictionary()
#: id(user optimizer) -> record, for wrap_optimizer (the optimizer objects outlive prepare()).
_engine_of_optimizer: dict[int, EngineRecord] = {}


def records_of(accelerator: PluginAccelerator) -> list[EngineRecord]:
    return _engines_by_accelerator.setdefault(accelerator, [])


def record_of_engine(engine: Any) -> EngineRecord | None:
    for records in _engines_by_accelerator.values():
        for record in records:
            if record.engine is engine:
                return record
    return None


def training_record(accelerator: PluginAccelerator) -> EngineRecord:
    """The engine ``accelerator.backward`` drives: the last one prepared with an optimizer (as Accelerate;
    train disjoint models with one Accelerator each)."""
    for record in reversed(records_of(accelerator)):
        if record.user_optimizer is not None:
            return record
    raise ConfigurationError(
        "accelerator.backward() with the deepspeed backend needs a model prepared together with its optimizer "
        "(accelerator.prepare(model, optimizer, ...)); this Accelerator prepared none"
    )


def _optimizer_for(model: torch.nn.Module, pending: list[Any]) -> Any:
    """The optimizer of this prepare() call that holds ``model``'s parameters (None if none does)."""
    parameters = {id(parameter) for parameter in model.parameters()}
    matches = [
        optimizer
        for optimizer in pending
        if any(id(p) in parameters for group in optimizer.param_groups for p in group["params"])
    ]
    if len(matches) > 1:
        raise ConfigurationError(
            f"{len(matches)} optimizers passed to prepare() hold parameters of the same model; DeepSpeed builds "
            "one engine per model and optimizer"
        )
    return matches[0] if matches else None


def build_engine(model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool) -> Any:
    """Create the engine for ``model`` from the active plugin, the optimizer of the same prepare() call and,
    for a DummyOptim, its DummyScheduler."""
    deepspeed = import_deepspeed(accelerator.device.type)
    plugin = get_active_deepspeed_plugin(accelerator.state)
    optimizer = (
        None if evaluation_mode else _optimizer_for(model, list(accelerator.prepared.pending_optimizers))
    )
    training = optimizer is not None
    config = fill_config(
        plugin.deepspeed_config, accelerator, model, optimizer, training, plugin.is_train_batch_min
    )
    check_precision_supported(
        resolve_precision(config, accelerator.mixed_precision), accelerator.mixed_precision
    )

    set_moe_leaf_modules(model, plugin)
    _partition_for_nvme(deepspeed, model, config)

    kwargs: dict[str, Any] = {"model": model, "config": config, "dist_init_required": False}
    if isinstance(optimizer, DummyOptim):
        kwargs["model_parameters"] = [p for p in model.parameters() if p.requires_grad]
        scheduler = optimizer.scheduler
        if (
            scheduler is not None
            and "scheduler" not in config
            and scheduler.lr_scheduler_callable is not None
        ):
            kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
    elif optimizer is not None:
        kwargs["optimizer"] = optimizer
    engine, engine_optimizer, _, engine_scheduler = deepspeed.initialize(**kwargs)
    if isinstance(optimizer, DummyOptim) and optimizer.scheduler is not None:
        optimizer.scheduler.engine_scheduler = engine_scheduler

    # The kernel's accumulate() uses a wrapped model's no_sync(); the engine's refuses ZeRO 2/3 and is not
    # needed: the accumulation boundary (set from sync_gradients in backward) decides when gradients reduce.
    engine.__dict__["no_sync"] = contextlib.nullcontext
    # Duck-typed protocol for the kernel's get_state_dict/save_model: the full (gathered) weights.
    engine.__dict__["full_state_dict"] = lambda: gathered_state_dict(engine)

    record = EngineRecord(engine=engine, plugin=plugin, config=config, user_optimizer=optimizer)
    records_of(accelerator).append(record)
    if optimizer is not None:
        _engine_of_optimizer[id(optimizer)] = record
    return engine


def _partition_for_nvme(deepspeed: Any, model: torch.nn.Module, config: dict[str, Any]) -> None:
    """Partition a ZeRO-3 model whose parameters go to NVMe before the engine does it.

    The engine partitions a model created outside ``zero3_init`` by passing its parameters' dtype to
    ``zero.Init``, which (DeepSpeed 0.19, ``Init._set_dtype``) turns an explicit dtype into bf16 on a device
    without fp16 (every CPU without oneDNN fp16): the NVMe swapper then stores fp32 parameters as bf16 and
    training drifts (0.03 after 3 Adam steps here). Partitioning from the config lets it read the precision
    from ``bf16``/``fp16.enabled`` instead, as ``zero3_init`` does."""
    zero = config.get("zero_optimization", {})
    if zero.get("stage") != 3 or get_nested(zero, "offload_param", "device") != "nvme":
        return
    if any(not hasattr(parameter, "ds_id") for parameter in model.parameters()):
        deepspeed.zero.Init(module=model, config_dict_or_path=config)


def get_nested(node: Any, *keys: str) -> Any:
    """``node[keys[0]][keys[1]]...``, or None where a level is missing or not a dict."""
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def engine_optimizer(optimizer: Any) -> DeepSpeedOptimizerWrapper:
    record = _engine_of_optimizer.get(id(optimizer))
    if record is None:
        raise ConfigurationError(
            f"the {type(optimizer).__name__} passed to prepare() belongs to no DeepSpeed engine: with the deepspeed "
            "backend pass each optimizer to the same accelerator.prepare() call as its model"
        )
    return DeepSpeedOptimizerWrapper(record.engine.optimizer, engine=record.engine)


class _NormRecordingWrapper(DeepSpeedEngineWrapper):
    """Records the full gradient norm at boundaries for engines whose optimizer does not compute one."""

    def __init__(self, record: EngineRecord) -> None:
        super().__init__(record.engine)
        self.record = record

    def before_step(self, boundary: bool) -> None:
        if boundary and not _optimizer_records_norm(self.engine):
            self.record.last_grad_norm = _local_full_grad_norm(self.engine.module)


def backward(loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]) -> None:
    """One micro step through the engine (see DeepSpeedEngineWrapper)."""
    record = training_record(accelerator)
    # The kernel already divided the loss by the accumulation steps: the engine must not divide again.
    _NormRecordingWrapper(record).backward(
        loss,
        sync_gradients=bool(accelerator.sync_gradients),
        retain_graph=bool(backward_kwargs.get("retain_graph", False)),
        scale_wrt_gas=False,
    )


def _optimizer_records_norm(engine: Any) -> bool:
    # ZeRO optimizers and DeepSpeed's bf16/fp16 optimizers compute the global norm in step(); a plain torch
    # optimizer at stage 0 does not.
    return engine.zero_optimization() or engine.bfloat16_enabled() or engine.fp16_enabled()


def _local_full_grad_norm(module: torch.nn.Module) -> torch.Tensor:
    # At stage 0 every process holds the all-reduced full gradients after a boundary backward.
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    return torch.nn.utils.get_total_norm(grads, 2.0)


def grad_norm(accelerator: PluginAccelerator, max_norm: float) -> torch.Tensor:
    """The global gradient norm of the last optimizer step (before clipping). Clipping itself happens inside
    the engine, by the config's ``gradient_clipping``."""
    record = training_record(accelerator)
    configured = record.config.get("gradient_clipping") or None  # 0.0: written by autofill, no clipping
    if configured is None or float(configured) != float(max_norm):
        _warn_clipping_once(configured, max_norm)
    norm = (
        record.engine.get_global_grad_norm()
        if _optimizer_records_norm(record.engine)
        else record.last_grad_norm
    )
    if norm is None:
        return torch.tensor(0.0)
    return norm.detach().float() if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))


_warned_clipping: set[tuple[Any, float]] = set()


def _warn_clipping_once(configured: Any, max_norm: float) -> None:
    import warnings

    key = (configured, float(max_norm))
    if key in _warned_clipping:
        return
    _warned_clipping.add(key)
    warnings.warn(
        f"accelerator.clip_grad_norm_(max_norm={max_norm}) with the deepspeed backend: the engine clips by the "
        f"config's gradient_clipping ({configured if configured is not None else 'not set: no clipping'}); set "
        f'DeepSpeedPlugin(gradient_clipping={max_norm}) or "gradient_clipping": {max_norm} in the config',
        stacklevel=4,
    )


def engine_precision(accelerator: PluginAccelerator) -> str:
    """The precision the active configuration trains in ("no", "bf16", "fp16")."""
    records = records_of(accelerator)
    if records:
        config = records[-1].config
    else:
        config = dict(get_active_deepspeed_plugin(accelerator.state).deepspeed_config)
        config = {key: dict(value) if isinstance(value, dict) else value for key, value in config.items()}
    return resolve_precision(config, accelerator.mixed_precision)


# -- weights -------------------------------------------------------------------------------------------------
def gathered_state_dict(engine: Any) -> dict[str, torch.Tensor]:
    """The full state dict of the engine's module on every process, in the engine's dtype (16-bit under
    bf16/fp16, fp32 otherwise). ZeRO-3 parameters are gathered one module at a time into CPU copies."""
    module = engine.module
    if not engine.zero_optimization_partition_weights():
        return {key: value.detach().cpu().clone() for key, value in module.state_dict().items()}
    import deepspeed

    state: dict[str, torch.Tensor] = {}
    for prefix, submodule in module.named_modules():
        own = list(submodule.parameters(recurse=False))
        with deepspeed.zero.GatheredParameters(own, modifier_rank=None):
            for name, tensor in [
                *submodule.named_parameters(recurse=False),
                *submodule.named_buffers(recurse=False),
            ]:
                key = f"{prefix}.{name}" if prefix else name
                if key not in state and tensor is not None:
                    state[key] = tensor.detach().cpu().clone()
    # Keep the module's own key order (and the keys state_dict() would have, e.g. persistent buffers only).
    ordered = {key: state[key] for key in module.state_dict().keys() if key in state}
    return ordered


def fp32_state_dict_from_checkpoint(checkpoint_dir: str, tag: str | None = None) -> dict[str, torch.Tensor]:
    """Full fp32 weights from a checkpoint's ZeRO partitions (DeepSpeed's zero_to_fp32), on the CPU."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=tag)


@contextlib.contextmanager
def zero3_init(plugin_or_accelerator: Any = None, enabled: bool = True) -> Iterator[None]:
    """Create a model's parameters already partitioned across processes (``deepspeed.zero.Init``) when the
    active configuration is ZeRO stage 3; a no-op otherwise (or with ``enabled=False``).

    Accepts a :class:`DeepSpeedPlugin`, an Accelerator, or nothing (the active plugin of the running state).
    """
    if isinstance(plugin_or_accelerator, DeepSpeedPlugin):
        plugin = plugin_or_accelerator
        mixed_precision = "no"
    else:
        from drivetrain.plugin_api.state import AcceleratorState

        state = plugin_or_accelerator.state if plugin_or_accelerator is not None else AcceleratorState()
        plugin = get_active_deepspeed_plugin(state)
        mixed_precision = state.mixed_precision
    with partitioned_init(plugin, mixed_precision, enabled):
        yield
