"""The deepspeed plugin's hook implementations. See docs/deepspeed.md for the user's view and
docs/backends.md for how DeepSpeed maps onto the hooks.

Nothing here imports deepspeed at module level: listing plugins or parsing ``drivetrain launch`` options
stays fast; the engine modules import it when a run starts.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, PluginAccelerator, PluginInfo

PLUGIN_INFO = PluginInfo(
    kind="backend",
    requires=("deepspeed",),
    description="DeepSpeed engines: ZeRO stages 0-3, CPU/NVMe offload, several models",
    # fp16 is handed to DeepSpeed (its loss scaler) but DeepSpeed refuses it on CPU and it is untested here.
    # The engine reduces gradients inside backward (local_gradients=False), keeps bf16 weights with fp32
    # master copies in the optimizer (low_precision_weights=True) and clips by its config's
    # gradient_clipping (0: off), as in Accelerate: accelerator.clip_grad_norm_ returns the engine's norm.
    capabilities=Capabilities(
        multi_process=True,
        sharded_state=True,
        precisions=("no", "bf16"),
        devices=("cpu", "cuda"),
        local_gradients=False,
        low_precision_weights=True,
        clipping_setting="gradient_clipping",
    ),
    distributed_type="DEEPSPEED",
    config_section="deepspeed_config",
    launch_flag="use_deepspeed",
    places_model=True,
    manages_precision=True,
    # ParallelismConfig(sp_backend="deepspeed", sp_size=...): Ulysses sequence parallelism (ALST).
    sp_backend="deepspeed",
)


@hookimpl
def register_extensions(registry: Any) -> None:
    from drivetrain_deepspeed import selection, sequence_parallel
    from drivetrain_deepspeed.launcher import add_launch_options, launch_with_deepspeed

    registry.add_launch_options(add_launch_options)
    registry.add_launcher("deepspeed", launch_with_deepspeed)
    # Accelerate's spellings for scripts written for it (accelerator.state.select_deepspeed_plugin("teacher")).
    registry.add_state_attribute("deepspeed_plugin", selection.state_deepspeed_plugin, on_accelerator=True)
    registry.add_state_attribute("deepspeed_plugins", selection.state_deepspeed_plugins)
    registry.add_state_attribute("select_deepspeed_plugin", selection.state_select_deepspeed_plugin)
    registry.add_state_attribute("get_deepspeed_plugin", selection.state_get_deepspeed_plugin)
    registry.add_state_attribute(
        "deepspeed_ulysses_dl_adapter", sequence_parallel.state_ulysses_dl_adapter, on_accelerator=True
    )


@hookimpl
def setup_process_group(device: torch.device, init_kwargs: dict[str, Any], backend_config: Any) -> Any:
    from drivetrain_deepspeed.process_group import join_process_group
    from drivetrain_deepspeed.selection import resolve_all

    resolve_all(
        backend_config
    )  # a conflict with the launcher stops Accelerator(...), not its first prepare()
    return join_process_group(device, init_kwargs)


@hookimpl
def wrap_model(model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool) -> Any:
    from drivetrain_deepspeed.engine import build_engine, engine_precision, record_of_engine

    if record_of_engine(model) is not None:
        return None
    engine = build_engine(model, accelerator, evaluation_mode)
    if accelerator.mixed_precision == "no" and engine_precision(accelerator) != "no":
        # The DeepSpeed config alone asked for 16-bit: the module's weights are 16-bit now, so its forward
        # must run under autocast (the kernel patches forward only when mixed_precision is set).
        from drivetrain.plugin_api.training import patch_forward_with_autocast

        patch_forward_with_autocast(model, accelerator.autocast)
    return engine


@hookimpl
def wrap_optimizer(optimizer: torch.optim.Optimizer, accelerator: PluginAccelerator) -> Any:
    from drivetrain_deepspeed.engine import engine_optimizer

    return engine_optimizer(optimizer)


@hookimpl
def backward(loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]) -> bool:
    from drivetrain_deepspeed.engine import backward as engine_backward

    engine_backward(loss, accelerator, backward_kwargs)
    return True


@hookimpl
def clip_grad_norm(
    parameters: list, max_norm: float, norm_type: float, accelerator: PluginAccelerator
) -> torch.Tensor:
    from drivetrain_deepspeed.engine import grad_norm

    return grad_norm(accelerator, max_norm)


_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@hookimpl
def autocast(accelerator: PluginAccelerator, autocast_kwargs: dict[str, Any]) -> Any:
    from drivetrain_deepspeed.engine import engine_precision

    dtype = _AUTOCAST_DTYPES.get(engine_precision(accelerator))
    if dtype is None:
        return contextlib.nullcontext()
    # The engine keeps 16-bit weights; autocast lets fp32 inputs meet them.
    return torch.autocast(device_type=accelerator.device.type, dtype=dtype, **autocast_kwargs)


@hookimpl
def save_state(
    output_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    schedulers: list,
    save_kwargs: dict[str, Any],
) -> bool:
    from drivetrain_deepspeed.checkpoint import save_state as save

    save(output_dir, accelerator, models, schedulers, save_kwargs)
    return True


@hookimpl
def load_state(
    input_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
) -> bool:
    from drivetrain_deepspeed.checkpoint import load_state as load

    load(input_dir, accelerator, models, schedulers, map_location, load_kwargs)
    return True
