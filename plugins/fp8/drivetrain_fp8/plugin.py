"""The fp8 plugin's hook implementations: ``mixed_precision="fp8"`` through torchao, TransformerEngine or
MS-AMP.

A precision plugin runs before the distribution backend in chained hooks, so ``wrap_model`` converts the
model here and ddp/fsdp/deepspeed then wrap the converted model. Forward runs under bf16 autocast (the
layers that stay in high precision compute in bf16, as Accelerate does for fp8); TransformerEngine adds its
fp8 autocast around that.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import attrs
import torch

from drivetrain.plugin_api import Capabilities, ConfigurationError, PluginAccelerator, PluginInfo, hookimpl
from drivetrain.plugin_api.training import AcceleratedOptimizer, patch_forward_with_autocast
from drivetrain_fp8 import options
from drivetrain_fp8.selection import Choice, check_composition, choose

PLUGIN_INFO = PluginInfo(
    kind="precision",
    description="FP8 training: torchao float8 (CPU and GPU), NVIDIA TransformerEngine, Microsoft MS-AMP",
    precisions=("fp8",),
    # Accelerate runs fp8 models under bf16 autocast: what is not fp8 computes in bf16.
    autocast_dtype="bfloat16",
    capabilities=Capabilities(multi_process=True, precisions=("fp8",), devices=("cpu", "cuda")),
    optional_requires={
        "torchao": "fp8 backend ao, CPU and GPU; pip install torchao",
        "transformer_engine": "fp8 backend te, NVIDIA GPUs with fp8; "
        "pip install --no-build-isolation transformer-engine[pytorch]",
        "msamp": "fp8 backend msamp, NVIDIA GPUs with fp8; MS-AMP is built from source",
    },
)

#: Backends that run fp8 themselves (Megatron-LM through its own TransformerEngine layers): the model is
#: left to them, as Accelerate does.
SELF_MANAGED_BACKENDS = ("megatron",)


@attrs.define(eq=False)
class Fp8Run:
    """What the plugin chose for one Accelerator and what it converted so far."""

    choice: Choice
    backend: str
    #: parameters the conversion replaced, old -> new (optimizers prepared later are pointed at the new)
    replaced: dict[torch.nn.Parameter, torch.nn.Parameter] = attrs.Factory(dict)
    #: torchao models sharded with float8 all-gather whose scales are precomputed after the next optimizer
    awaiting_scale_hook: list[torch.nn.Module] = attrs.Factory(list)
    #: models whose forward this plugin already patched
    patched: weakref.WeakSet = attrs.Factory(weakref.WeakSet)
    #: MS-AMP: id(user optimizer) -> MS-AMP's optimizer
    msamp_optimizers: dict[int, Any] = attrs.Factory(dict)
    #: MS-AMP trains with a GradScaler
    scaler: Any = None

    @property
    def library(self) -> str:
        return self.choice.library.name


_runs: weakref.WeakKeyDictionary[Any, Fp8Run] = weakref.WeakKeyDictionary()


def fp8_run(accelerator: PluginAccelerator) -> Fp8Run:
    """The fp8 decisions for ``accelerator``, made on first use and checked against its backend and device."""
    run = _runs.get(accelerator)
    if run is None:
        choice = choose(list(accelerator.kwargs_handlers), options.launched_settings())
        backend = accelerator.state.backend_name
        check_composition(choice.library, backend, accelerator.device.type)
        run = Fp8Run(choice=choice, backend=backend)
        if run.library == "msamp":
            run.scaler = torch.amp.GradScaler(accelerator.device.type)
        _runs[accelerator] = run
    return run


@hookimpl
def register_extensions(registry: Any) -> None:
    registry.add_launch_options(options.add_arguments)
    if hasattr(registry, "add_config_keys"):
        registry.add_config_keys({options.CONFIG_KEY: options.check_fp8_config})


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    run = fp8_run(accelerator)
    if run.backend in SELF_MANAGED_BACKENDS:
        return None
    if run.library == "ao":
        _convert_ao(model, run)
    elif run.library == "te":
        _convert_te(model, run)
    else:
        model = _initialize_msamp(model, run, accelerator, evaluation_mode)
    if model not in run.patched:
        patch_forward_with_autocast(model, accelerator.autocast)
        if run.library == "te":
            from drivetrain_fp8.transformer_engine import apply_fp8_autowrap

            apply_fp8_autowrap(model, run.choice.recipe)
        run.patched.add(model)
    return model


def _convert_ao(model: torch.nn.Module, run: Fp8Run) -> None:
    from drivetrain_fp8.ao import convert_model_to_fp8_ao, has_ao_layers
    from drivetrain_fp8.rebinding import replaced_by

    if has_ao_layers(model):
        return  # converted already (by the script, or an earlier prepare of the same model)
    recipe = run.choice.recipe
    config = recipe.float8_config(under_fsdp=run.backend == "fsdp")
    run.replaced.update(
        replaced_by(model, lambda: convert_model_to_fp8_ao(model, config, recipe.module_filter_func))
    )
    if run.backend == "fsdp" and config.enable_fsdp_float8_all_gather:
        run.awaiting_scale_hook.append(model)


def _convert_te(model: torch.nn.Module, run: Fp8Run) -> None:
    from drivetrain_fp8.rebinding import replaced_by
    from drivetrain_fp8.transformer_engine import convert_model, has_transformer_engine_layers

    if has_transformer_engine_layers(model):
        return
    run.replaced.update(replaced_by(model, lambda: convert_model(model)))


def _initialize_msamp(
    model: torch.nn.Module, run: Fp8Run, accelerator: PluginAccelerator, evaluation_mode: bool
) -> Any:
    from drivetrain_fp8 import msamp

    optimizer = msamp.the_optimizer_of(list(accelerator.prepared.pending_optimizers), evaluation_mode)
    model, run.msamp_optimizers[id(optimizer)] = msamp.initialize(
        model, optimizer, run.choice.recipe.opt_level
    )
    return model


@hookimpl
def wrap_optimizer(optimizer: torch.optim.Optimizer, accelerator: PluginAccelerator) -> Any:
    run = fp8_run(accelerator)
    if run.backend in SELF_MANAGED_BACKENDS:
        return None
    if run.library == "msamp":
        return _msamp_optimizer(optimizer, run)
    if run.replaced:
        from drivetrain_fp8.rebinding import rebind_optimizer

        rebind_optimizer(optimizer, run.replaced)
    while run.awaiting_scale_hook:
        from drivetrain_fp8.ao import precompute_scales_after_step

        precompute_scales_after_step(optimizer, run.awaiting_scale_hook.pop(0))
    return None


def _msamp_optimizer(optimizer: torch.optim.Optimizer, run: Fp8Run) -> Any:
    converted = run.msamp_optimizers.pop(id(optimizer), None)
    if converted is None:
        raise ConfigurationError(
            "fp8 backend msamp converts a model and its optimizer together: pass this optimizer to the same "
            "accelerator.prepare(model, optimizer) call as its model"
        )
    # The kernel keeps an AcceleratedOptimizer as it is: this one steps through MS-AMP's GradScaler.
    return AcceleratedOptimizer(converted, scaler=run.scaler)


@hookimpl
def autocast(
    accelerator: PluginAccelerator, autocast_kwargs: dict[str, Any]
) -> contextlib.AbstractContextManager | None:
    # The dtype PLUGIN_INFO declares (bf16), which Accelerate's get_mixed_precision_context_manager also uses.
    dtype = getattr(torch, PLUGIN_INFO.autocast_dtype or "bfloat16")
    return torch.autocast(device_type=accelerator.device.type, dtype=dtype, **autocast_kwargs)


@hookimpl
def backward(
    loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]
) -> bool | None:
    run = fp8_run(accelerator)
    if run.scaler is None:
        return None
    run.scaler.scale(loss).backward(**backward_kwargs)
    return True


@hookimpl
def clip_grad_norm(accelerator: PluginAccelerator) -> None:
    # MS-AMP: gradients are scaled until unscaled; clipping must see their true values. The next plugin
    # (the distribution backend or local) then clips.
    run = fp8_run(accelerator)
    if run.scaler is not None and accelerator.gradient_state.sync_gradients:
        for optimizer in accelerator.prepared.optimizers:
            run.scaler.unscale_(getattr(optimizer, "optimizer", optimizer))
    return None
