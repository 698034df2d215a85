"""Filling a DeepSpeed config's ``"auto"`` values from the Accelerator and the objects being prepared.

Each filled value has one source: the Accelerator (processes, accumulation steps, precision), the data
loader (micro batch size), the model (hidden size, for ZeRO bucket sizes) or the ``DummyOptim`` /
``DummyScheduler`` (optimizer and scheduler parameters). An explicit config value that contradicts what the
Accelerator was told is an error naming both, never silently overridden.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator
from drivetrain_deepspeed.dummies import DummyOptim, DummyScheduler
from drivetrain_deepspeed.paths import get_path, set_path

#: ZeRO settings that fall back to DeepSpeed's defaults when "auto" and the model has no ``config.hidden_size``.
_HIDDEN_SIZE_KEYS = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}
_DEFAULTED_ZERO_KEYS = (
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "allgather_bucket_size",
    "sub_group_size",
    "stage3_gather_16bit_weights_on_model_save",
)
_PRECISION_SECTIONS = {"bf16": "bf16", "fp16": "fp16"}
#: DeepSpeed's value for "do not clip" (a config without the key clips at DeepSpeed's default, 1.0 in 0.19).
NO_CLIPPING = 0.0


def _batch_size(loader: Any) -> int | None:
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) else None


def loader_batch_sizes(accelerator: PluginAccelerator) -> list[int]:
    """Per-process batch sizes of the data loaders of this ``prepare`` call, else of those prepared before
    (which report their per-process batch size already)."""
    sizes = [_batch_size(loader) for loader in accelerator.prepared.pending_dataloaders]
    pending = [size for size in sizes if size is not None]
    if pending:
        if accelerator.split_batches:
            return [size // accelerator.num_processes for size in pending]
        return pending
    for loader in accelerator.prepared.dataloaders:
        size = _batch_size(loader)
        if size is not None:
            return [size]
    return []


def micro_batch_size(accelerator: PluginAccelerator, is_train_batch_min: bool = True) -> int | None:
    """The micro batch size "auto" becomes: with a training and an evaluation loader in one ``prepare`` call,
    the smaller of their batch sizes (``DeepSpeedPlugin.is_train_batch_min``, the default) or the larger."""
    sizes = loader_batch_sizes(accelerator)
    if not sizes:
        return None
    return min(sizes) if is_train_batch_min else max(sizes)


def _auto(value: Any) -> bool:
    return value == "auto"


def _fill_or_check(config: dict[str, Any], key: str, value: Any, source: str) -> None:
    current = get_path(config, key)
    if current is None or _auto(current):
        set_path(config, key, value)
    elif current != value:
        raise ConfigurationError(
            f"conflicting DeepSpeed setting {key!r}: the DeepSpeed config says {current!r} but {source} is "
            f'{value!r}; make them agree or write "auto" in the config'
        )


def resolve_precision(config: dict[str, Any], mixed_precision: str) -> str:
    """The precision the engine runs in ("no", "bf16", "fp16"); fills ``bf16/fp16.enabled`` "auto"."""
    if mixed_precision == "fp8":
        # The fp8 precision plugin converted the model's Linear layers before the engine is built; the engine
        # keeps everything else in bf16, as Accelerate runs DeepSpeed under fp8.
        mixed_precision = "bf16"
    explicit = [name for name in _PRECISION_SECTIONS if get_path(config, f"{name}.enabled") is True]
    if len(explicit) > 1:
        raise ConfigurationError("the DeepSpeed config enables both bf16 and fp16; enable one")
    if explicit and mixed_precision not in ("no", explicit[0]):
        raise ConfigurationError(
            f"conflicting precision: the DeepSpeed config enables {explicit[0]} but the Accelerator's "
            f'mixed_precision is {mixed_precision!r}; make them agree or write "enabled": "auto"'
        )
    for name in _PRECISION_SECTIONS:
        if mixed_precision == name and get_path(config, f"{name}.enabled") is False:
            raise ConfigurationError(
                f"conflicting precision: the Accelerator's mixed_precision is {name!r} but the DeepSpeed config "
                f'says {name}.enabled=false; make them agree or write "enabled": "auto"'
            )
    chosen = explicit[0] if explicit else mixed_precision
    for name in _PRECISION_SECTIONS:
        if _auto(get_path(config, f"{name}.enabled")):
            set_path(config, f"{name}.enabled", chosen == name)
    return chosen if chosen in ("bf16", "fp16") else "no"


def fill_config(
    base: dict[str, Any],
    accelerator: PluginAccelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    training: bool,
    is_train_batch_min: bool = True,
) -> dict[str, Any]:
    """A copy of ``base`` with every "auto" replaced; raises naming any value it cannot fill."""
    config = copy.deepcopy(base)
    world_size = accelerator.num_processes

    # -- batch sizes and accumulation ---------------------------------------------------------------------
    steps = accelerator.gradient_accumulation_steps
    configured_steps = config.get("gradient_accumulation_steps")
    if configured_steps is None or _auto(configured_steps):
        config["gradient_accumulation_steps"] = steps
    elif int(configured_steps) != steps:
        if steps != 1:
            raise ConfigurationError(
                f"conflicting gradient_accumulation_steps: the DeepSpeed config (or DeepSpeedPlugin) says "
                f"{configured_steps} but the Accelerator's is {steps}; set it in one place"
            )
        # Only the DeepSpeed config set it: the Accelerator accumulates as the engine does (as Accelerate).
        accelerator.gradient_accumulation_steps = int(configured_steps)
    steps = int(config["gradient_accumulation_steps"])

    micro = config.get("train_micro_batch_size_per_gpu")
    loader_micro = micro_batch_size(accelerator, is_train_batch_min)
    if micro is None or _auto(micro):
        if loader_micro is None:
            total = config.get("train_batch_size")
            if isinstance(total, int):
                loader_micro = total // (steps * world_size)
            elif not training:
                loader_micro = 1  # an inference engine never checks it against real batches
            else:
                raise ConfigurationError(
                    'the DeepSpeed config\'s train_micro_batch_size_per_gpu is "auto" but no data loader was '
                    "prepared yet to read it from: pass the training DataLoader to the same accelerator.prepare() "
                    "call as the model (or prepare it first), or set train_micro_batch_size_per_gpu in the config"
                )
        config["train_micro_batch_size_per_gpu"] = loader_micro
    elif training and loader_micro is not None and int(micro) not in loader_batch_sizes(accelerator):
        raise ConfigurationError(
            f"conflicting micro batch size: the DeepSpeed config's train_micro_batch_size_per_gpu is {micro} but "
            f'the prepared data loader yields {loader_micro} samples per process; make them agree or write "auto"'
        )
    micro = int(config["train_micro_batch_size_per_gpu"])
    _fill_or_check(
        config,
        "train_batch_size",
        micro * steps * world_size,
        f"micro batch {micro} x accumulation {steps} x {world_size} processes",
    )

    # -- clipping and precision ---------------------------------------------------------------------------
    if config.get("gradient_clipping") is None or _auto(config.get("gradient_clipping")):
        # Nobody asked for clipping, so the engine must not clip. Leaving the key out is not enough: DeepSpeed
        # 0.19 defaults gradient_clipping to 1.0 and silently rescaled every step whose norm exceeded 1 (seen
        # as a 0.02 weight difference against the reference backend in the conformance suite).
        config["gradient_clipping"] = NO_CLIPPING
    resolve_precision(config, accelerator.mixed_precision)

    # -- ZeRO ------------------------------------------------------------------------------------------------
    zero = config.setdefault("zero_optimization", {})
    if _auto(zero.get("stage")):
        zero["stage"] = 2
    for part in ("offload_optimizer", "offload_param"):
        if isinstance(zero.get(part), dict) and _auto(zero[part].get("device")):
            zero[part]["device"] = "none"
    hidden = _hidden_size(model)
    for key, formula in _HIDDEN_SIZE_KEYS.items():
        if _auto(zero.get(key)):
            if hidden is None:
                del zero[key]  # DeepSpeed's default
            else:
                zero[key] = formula(hidden)
    for key in _DEFAULTED_ZERO_KEYS:
        if _auto(zero.get(key)):
            del zero[key]

    # -- optimizer and scheduler ---------------------------------------------------------------------------
    _fill_optimizer(config, optimizer)
    if optimizer is not None and not isinstance(optimizer, DummyOptim):
        # ZeRO refuses optimizers outside its tested list (Adam, Lamb ...) unless allowed: the script chose it.
        config.setdefault("zero_allow_untested_optimizer", True)
    _check_nvme(config)
    offloaded = get_path(config, "zero_optimization.offload_optimizer.device") in ("cpu", "nvme")
    if offloaded and optimizer is not None and not isinstance(optimizer, DummyOptim):
        # DeepSpeed refuses a torch optimizer with offload unless told that it was chosen on purpose; the torch
        # optimizer then steps on the CPU partitions (DeepSpeedCPUAdam is faster but compiles a C++ op).
        if not _is_deepspeed_cpu_optimizer(optimizer):
            config.setdefault("zero_force_ds_cpu_optimizer", False)

    remaining = _auto_paths(config)
    if remaining:
        raise ConfigurationError(
            f'the DeepSpeed config still has "auto" values drivetrain cannot fill: {", ".join(remaining)}; '
            "set them in the config"
        )
    return config


def _fill_optimizer(config: dict[str, Any], optimizer: Any) -> None:
    has_section = "optimizer" in config
    if isinstance(optimizer, DummyOptim):
        if not has_section:
            raise ConfigurationError(
                'a DummyOptim was passed to prepare() but the DeepSpeed config has no "optimizer" section; pass a '
                "real torch optimizer or add the section"
            )
        params = config["optimizer"].setdefault("params", {})
        candidates = {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay, **optimizer.kwargs}
        for key, value in list(params.items()):
            if _auto(value):
                if key not in candidates:
                    raise ConfigurationError(
                        f'DeepSpeed config optimizer.params.{key} is "auto" but DummyOptim got no {key}=...; '
                        "pass it to DummyOptim or set it in the config"
                    )
                params[key] = candidates[key]
        scheduler = optimizer.scheduler
        if "scheduler" in config:
            if scheduler is None:
                raise ConfigurationError(
                    'the DeepSpeed config has a "scheduler" section: pass a DummyScheduler(optimizer, ...) to '
                    "prepare() with the DummyOptim"
                )
            _fill_scheduler(config, optimizer, scheduler)
    elif optimizer is not None and has_section:
        raise ConfigurationError(
            f'the DeepSpeed config defines an "optimizer" but prepare() got a {type(optimizer).__name__}; '
            "use drivetrain.utils.DummyOptim(model.parameters(), lr=...) or remove the config's optimizer section"
        )


def _fill_scheduler(config: dict[str, Any], optimizer: DummyOptim, scheduler: DummyScheduler) -> None:
    params = config["scheduler"].setdefault("params", {})
    candidates = {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": optimizer.lr,
        "warmup_num_steps": scheduler.warmup_num_steps,
        "total_num_steps": scheduler.total_num_steps,
        **scheduler.kwargs,
    }
    for key, value in list(params.items()):
        if _auto(value):
            if candidates.get(key) is None:
                raise ConfigurationError(
                    f'DeepSpeed config scheduler.params.{key} is "auto" but DummyScheduler got no {key}=...; '
                    "pass it to DummyScheduler or set it in the config"
                )
            params[key] = candidates[key]


def _check_nvme(config: dict[str, Any]) -> None:
    """An NVMe offload needs a folder (DeepSpeed would fail later, deep in its swapper, without one); below
    stage 3 DeepSpeed treats an NVMe optimizer offload as a CPU offload, which is worth a warning."""
    import warnings

    stage = get_path(config, "zero_optimization.stage")
    for part in ("offload_optimizer", "offload_param"):
        if get_path(config, f"zero_optimization.{part}.device") != "nvme":
            continue
        if not get_path(config, f"zero_optimization.{part}.nvme_path"):
            raise ConfigurationError(
                f"the DeepSpeed config's zero_optimization.{part}.device is 'nvme' but it has no "
                f"zero_optimization.{part}.nvme_path: set it (or DeepSpeedPlugin.{part}_nvme_path) to a folder "
                "on the NVMe disk"
            )
        if part == "offload_optimizer" and stage != 3:
            warnings.warn(
                f"offload_optimizer device 'nvme' at ZeRO stage {stage}: DeepSpeed swaps optimizer states to "
                "NVMe only at stage 3 and keeps them in CPU memory otherwise (as device 'cpu')",
                stacklevel=2,
            )


def _is_deepspeed_cpu_optimizer(optimizer: Any) -> bool:
    return type(optimizer).__module__.startswith("deepspeed.ops")


def _hidden_size(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None)
    if size is None:
        sizes = getattr(config, "hidden_sizes", None)
        size = max(sizes) if sizes else None
    return int(size) if size is not None else None


def _auto_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        found = []
        for key, value in node.items():
            found += _auto_paths(value, f"{prefix}{key}.")
        return found
    return [prefix.rstrip(".")] if _auto(node) else []
