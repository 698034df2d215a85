"""The xla backend's hooks: XLA device and replicas, graph sync points, XLA collectives, XLA-safe saving.

torch_xla records operations into a graph and runs it only when the graph is cut (``torch_xla.sync()``) or
a value is read. A training loop written for drivetrain never cuts it itself, so this backend does, at the
points where a step's work is complete:

- each batch of a prepared data loader (as torch_xla's parallel loader does) — see :mod:`.data`;
- after every optimizer step (the step of the prepared optimizer; gradients of replicas are all-reduced
  first, as ``xm.optimizer_step`` does), unless a prepared loader is being iterated, whose next batch cuts it;
- after a backward pass that does not end in a step (gradient accumulation) outside a prepared loader, so
  the graph stays one micro-step long;
- before collectives between replicas (:mod:`.collectives`) and before a checkpoint or ``get_state_dict``
  reads the weights, which are then copied to the CPU and written by the main process only.

Selected by name (``backend="xla"``, ``drivetrain launch --tpu``, ``distributed_type: XLA``) or
automatically when the device plugin ``xla_device`` reports an XLA device (``select_for_devices``).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import (
    Capabilities,
    ConfigurationError,
    DistributedEnvironment,
    DistributedType,
    PluginAccelerator,
    PluginInfo,
    environment_world_size,
)
from drivetrain.plugin_api.big_model import find_tied_parameters
from drivetrain.plugin_api.checkpoint import read_training_objects, write_training_objects
from drivetrain.plugin_api.data import prepare_data_loader
from drivetrain.plugin_api.state import register_rng_type
from drivetrain.plugin_api.training import track_step_for_schedulers
from drivetrain_xla import config as xla_config
from drivetrain_xla import launching, runtime
from drivetrain_xla.collectives import XlaCollectives
from drivetrain_xla.data import BatchSharding, XlaDataLoader, graph_cut_by_loader

PLUGIN_INFO = PluginInfo(
    kind="backend",
    description="XLA devices through torch_xla: TPUs, replicas launched by torch_xla, SPMD over a host's devices",
    requires=("torch_xla",),
    # "cpu": torch_xla's CPU device (PJRT_DEVICE=CPU), which cpu=True selects and the conformance suite uses.
    capabilities=Capabilities(multi_process=True, precisions=("no", "bf16"), devices=("xla", "cpu")),
    distributed_type="XLA",
    launch_flag="tpu",
    places_model=True,
    select_for_devices=("xla",),
)

#: Optimizers whose gradients clip_grad_norm_ already all-reduced in this step (reduced once, not twice).
_reduced_this_step: weakref.WeakSet[Any] = weakref.WeakSet()


class _Run:
    """This process's XLA setup (set by setup_process_group; read by the other hooks)."""

    config: xla_config.XlaConfig = xla_config.XlaConfig()
    mesh: Any = None
    world_size: int = 1


@hookimpl
def register_extensions(registry: Any) -> None:
    launching.register(registry)


# -- the process ------------------------------------------------------------------------------------------------
@hookimpl
def detect_device(cpu: bool) -> torch.device:
    if cpu:
        # cpu=True is kept when the XLA device is torch_xla's CPU device (the computation stays on the CPU).
        pjrt = os.environ.get("PJRT_DEVICE")
        if pjrt not in (None, "", "CPU"):
            raise ConfigurationError(
                f"backend 'xla' with cpu=True (or --cpu) but PJRT_DEVICE={pjrt}: the XLA device would not be "
                "the CPU; set PJRT_DEVICE=CPU for torch_xla's CPU device, or pick another backend to train "
                "without XLA"
            )
        os.environ["PJRT_DEVICE"] = "CPU"
    problem = runtime.torch_xla_problem()
    if problem is not None:
        raise ConfigurationError(f"backend 'xla' cannot run here: {problem}")
    return torch.device("xla", 0)


@hookimpl
def setup_process_group(device: torch.device, backend_config: Any) -> DistributedEnvironment | None:
    if device.type != "xla":
        return None
    run_config = xla_config.resolve(backend_config)
    _torch_xla, xm, xr = runtime.modules()
    if run_config.uses_spmd and not xr.is_spmd():
        # Must precede every use of the device: torch_xla builds the SPMD runtime when it first starts.
        xr.use_spmd()
    actual = runtime.device()
    if actual != device:
        raise ConfigurationError(
            f"torch_xla's device for this process is {actual}, not {device}: several XLA devices per process "
            "(threads, as xmp.spawn does on TPU v2/v3 and on CPU) are not supported; use SPMD "
            "(XlaConfig(spmd=True)) or one process per device"
        )
    world_size, rank = int(xr.world_size()), int(xr.global_ordinal())
    launched = environment_world_size()
    if launched > 1 and world_size != launched:
        raise ConfigurationError(
            f"this script was started as {launched} processes (WORLD_SIZE={launched}) but torch_xla sees "
            f"{world_size} replica(s): its collectives would return each process's own values (measured on "
            "the XLA CPU device under torchrun). Start XLA replicas with `drivetrain launch --tpu` "
            "(torch_xla's launcher), or use SPMD in one process"
        )
    _Run.config = run_config
    _Run.world_size = world_size
    if run_config.uses_spmd:
        import numpy as np
        import torch_xla.distributed.spmd as xs

        devices = int(xr.global_runtime_device_count())
        axis = "fsdp" if run_config.fsdp else "data"
        _Run.mesh = xs.Mesh(np.arange(devices), (devices, 1), (axis, "model"))
        if run_config.fsdp:
            # SpmdFullyShardedDataParallel shards over the global mesh's "fsdp" axis; batches go on it too.
            xs.set_global_mesh(_Run.mesh)
    register_rng_type(
        "xla",
        # torch_xla's generator state is one unsigned 64-bit seed; the kernel keeps states as tensors.
        lambda: torch.tensor(int(xm.get_rng_state()), dtype=torch.uint64),
        lambda state: xm.set_rng_state(int(state.item())),
        lambda seed: xm.set_rng_state(int(seed)),
    )
    return DistributedEnvironment(
        num_processes=world_size,
        process_index=rank,
        local_process_index=int(xr.local_ordinal()),
        local_num_processes=max(1, int(xr.local_process_count())) if world_size > 1 else 1,
        distributed_type=DistributedType.XLA,
        torch_backend="xla" if world_size > 1 else None,
        collectives=XlaCollectives(world_size, rank),
    )


# -- preparing ---------------------------------------------------------------------------------------------------
def _check_precision(accelerator: PluginAccelerator) -> None:
    if accelerator.mixed_precision not in PLUGIN_INFO.capabilities.precisions:
        raise ConfigurationError(
            f"mixed_precision={accelerator.mixed_precision!r} is not supported by backend 'xla' (valid: "
            f"{', '.join(PLUGIN_INFO.capabilities.precisions)}); XLA devices compute in bf16, not fp16"
        )


def retie(model: torch.nn.Module, tied_groups: list[list[str]]) -> None:
    """Make every name of each group point at the group's first parameter again (``module.to(xla)`` gives
    tied parameters one copy each), then let a model that knows its ties re-tie them (``tie_weights``)."""
    for names in tied_groups:
        keep = model.get_parameter(names[0])
        for name in names[1:]:
            owner_name, _, attribute = name.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            setattr(owner, attribute, keep)
    tie_weights = getattr(model, "tie_weights", None)
    if callable(tie_weights):
        tie_weights()


def _state_dict_on_cpu(state: Any) -> Any:
    """``state`` with every tensor copied to the CPU (one copy per tensor, so tied weights stay shared)."""
    copies: dict[int, torch.Tensor] = {}

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in copies:
                copies[id(value)] = value.detach().to("cpu")
            return copies[id(value)]
        if isinstance(value, dict):
            return type(value)((key, convert(item)) for key, item in value.items())
        if isinstance(value, (list, tuple)):
            return type(value)(convert(item) for item in value)
        return value

    return convert(state)


def _full_state_dict_on_cpu(module: torch.nn.Module) -> Any:
    def full_state_dict() -> dict[str, torch.Tensor]:
        # get_state_dict / save_model: the weights as computed so far, on the CPU (XLA-safe, like xm.save).
        runtime.sync()
        inner = getattr(module, "module", module) if _Run.config.fsdp else module
        return _state_dict_on_cpu(inner.state_dict())

    return full_state_dict


#: id of a parameter before the move to the device -> (a weak reference to it, the parameter after the move):
#: ``module.to(xla)`` makes new Parameter objects, so optimizers built on the model before ``prepare`` are
#: rebound in wrap_optimizer. Weak, so the CPU copies are freed; checked, so a reused id never matches.
_moved_parameters: dict[int, tuple[Any, torch.nn.Parameter]] = {}


def _moved(parameter: Any) -> Any:
    entry = _moved_parameters.get(id(parameter))
    if entry is None or entry[0]() is not parameter:
        return parameter
    return entry[1]


@hookimpl
def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, evaluation_mode: bool
) -> torch.nn.Module:
    _check_precision(accelerator)
    tied = find_tied_parameters(model)
    before = dict(model.named_parameters(remove_duplicate=False))
    model = model.to(accelerator.device)
    retie(model, tied)
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if before[name] is not parameter:
            _moved_parameters[id(before[name])] = (weakref.ref(before[name]), parameter)
    if _Run.config.fsdp and not evaluation_mode:
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        model = SpmdFullyShardedDataParallel(model, mesh=_Run.mesh)
    # The model protocol's full_state_dict (docs/hooks.md): what get_state_dict and save_model read.
    model.full_state_dict = _full_state_dict_on_cpu(model)
    return model


def rebind_to_moved_parameters(optimizer: Any) -> None:
    """Point ``optimizer``'s parameter groups (and any state it holds) at the models' parameters on the
    device, as Accelerate does on TPU: the optimizer was built on the CPU parameters the move replaced."""
    for group in optimizer.param_groups:
        group["params"] = [_moved(parameter) for parameter in group["params"]]
    if optimizer.state:
        moved = {}
        for parameter, state in optimizer.state.items():
            target = _moved(parameter)
            moved[target] = {
                key: value.to(target.device) if isinstance(value, torch.Tensor) and value.dim() > 0 else value
                for key, value in state.items()
            }
        optimizer.state.clear()
        optimizer.state.update(moved)


@hookimpl
def wrap_optimizer(optimizer: Any, accelerator: PluginAccelerator) -> None:
    rebind_to_moved_parameters(optimizer)
    step = optimizer.step

    def xla_step(*args: Any, **kwargs: Any) -> Any:
        # xm.optimizer_step: all-reduce the replicas' gradients (SPMD and one device need none), step, and
        # cut the graph so every training step is the same compiled graph.
        if _Run.world_size > 1 and optimizer not in _reduced_this_step:
            runtime.modules()[1].reduce_gradients(optimizer)
        _reduced_this_step.discard(optimizer)
        result = step(*args, **kwargs)
        if not graph_cut_by_loader():
            runtime.sync()
        return result

    optimizer.step = xla_step
    track_step_for_schedulers(optimizer)


@hookimpl
def shard_dataloader(
    dataloader: Any, accelerator: PluginAccelerator, device_placement: bool, options: Any
) -> Any:
    import dataclasses

    prepared = prepare_data_loader(
        dataloader, **dataclasses.replace(options, put_on_device=False).to_kwargs()
    )
    if not device_placement:
        return prepared
    sharding = None
    if _Run.mesh is not None:
        sharding = BatchSharding(_Run.mesh, "fsdp" if _Run.config.fsdp else "data")
    return XlaDataLoader(prepared, accelerator.device, sharding)


# -- the step ----------------------------------------------------------------------------------------------------
@hookimpl
def autocast(accelerator: PluginAccelerator, autocast_kwargs: dict[str, Any]) -> Any:
    _check_precision(accelerator)
    if accelerator.mixed_precision != "bf16":
        return None  # local's null context
    # torch.autocast on the "xla" device type (torch_xla.amp.autocast refuses the CPU device in 2.9).
    return torch.autocast("xla", dtype=torch.bfloat16, **autocast_kwargs)


@hookimpl
def backward(loss: torch.Tensor, accelerator: PluginAccelerator, backward_kwargs: dict[str, Any]) -> bool:
    loss.backward(**backward_kwargs)
    if not accelerator.sync_gradients and not graph_cut_by_loader():
        # A micro-step of gradient accumulation outside a prepared loader: no step will cut the graph.
        runtime.sync()
    return True


@hookimpl
def clip_grad_norm(
    parameters: list[torch.nn.Parameter], max_norm: float, norm_type: float, accelerator: PluginAccelerator
) -> torch.Tensor:
    if _Run.world_size > 1:
        # Clip the all-reduced gradients (what the step will apply), and do not reduce them again there.
        xm = runtime.modules()[1]
        for optimizer in accelerator.prepared.optimizers:
            inner = optimizer.optimizer
            xm.reduce_gradients(inner)
            _reduced_this_step.add(inner)
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


# -- checkpoints -------------------------------------------------------------------------------------------------
class _OnCpu:
    """An optimizer as ``write_training_objects`` sees it: its state dict copied to the CPU."""

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer

    def state_dict(self) -> Any:
        return _state_dict_on_cpu(self._optimizer.state_dict())


@hookimpl
def save_state(
    output_dir: str,
    accelerator: PluginAccelerator,
    weights: list[dict[str, torch.Tensor]],
    optimizers: list[Any],
    schedulers: list[Any],
    safe_serialization: bool,
) -> bool:
    # What xm.save does: run what is pending, copy to the CPU, and let the main process write.
    runtime.sync()
    if accelerator.is_main_process:
        weights = [_state_dict_on_cpu(state) for state in weights]
        optimizers = [_OnCpu(optimizer) for optimizer in optimizers]
    write_training_objects(output_dir, accelerator, weights, optimizers, schedulers, safe_serialization)
    return True


@hookimpl
def load_state(
    input_dir: str,
    accelerator: PluginAccelerator,
    models: list,
    optimizers: list,
    schedulers: list,
    map_location: Any,
    load_kwargs: dict[str, Any],
    verified: Any,
) -> bool:
    read_training_objects(
        input_dir, accelerator, models, optimizers, schedulers, map_location, load_kwargs, verified
    )
    runtime.sync()  # the loaded values become the device's data now, not inside the next step's graph
    return True
