"""The Accelerator: the facade a training script talks to.

It delegates: its settings are resolved by :class:`~drivetrain.config.accelerator_settings.AcceleratorSettings`,
the process by the state, and each call becomes hook calls on the active plugin stack or a service call
(data loading in ``data/``, model admission and wrappers in ``training/``). Checkpoints are an object of their own (:class:`~drivetrain.checkpoint.checkpointer.Checkpointer`, ``accelerator.checkpointer``);
experiment tracking (``tracking.TrackingMixin``) and profiling (``training.profiling.ProfilingMixin``) add
their methods as mixins.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from drivetrain import operations
from drivetrain.config.accelerator_settings import AcceleratorSettings
from drivetrain.config.dataclasses import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from drivetrain.config.enums import DistributedType, RNGType
from drivetrain.config.kwargs_handlers import AutocastKwargs, GradScalerKwargs, KwargsHandler
from drivetrain.config.parallelism import ParallelismConfig, TorchTensorParallelPlugin
from drivetrain.contract.arguments import PreparedObjects, ShardingOptions
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.contract.selection import check_handlers_have_their_plugin
from drivetrain.errors import ConfigurationError
from drivetrain.operations.memory import empty_device_cache
from drivetrain.state import AcceleratorState, GradientState
from drivetrain.tracking import TrackingMixin, validate_log_with
from drivetrain.training.admission import check_trainable, kind_of, spans_several_devices
from drivetrain.training.admission import excluded_device_available as is_xpu_available
from drivetrain.training.admission import (
    quantization_computes_on_cpu as is_bitsandbytes_multi_backend_available,
)
from drivetrain.training.modeling import (
    ORIGINAL_FORWARD_ATTRIBUTE,
    extract_model_from_parallel,
    patch_forward_with_autocast,
    remember_original,
)
from drivetrain.training.optimizer import AcceleratedOptimizer, make_grad_scaler, unscale_gradients
from drivetrain.training.profiling import ProfilingMixin
from drivetrain.training.scheduler import AcceleratedScheduler, optimizers_stepping

if TYPE_CHECKING:
    from drivetrain.checkpoint.checkpointer import Checkpointer


class Accelerator(TrackingMixin, ProfilingMixin):
    """Run one training script unchanged on one CPU, many GPUs or any backend plugin.

    The constructor takes Accelerate's arguments plus ``backend`` (a plugin name), ``backend_config`` (a
    backend's configuration object; ``fsdp_plugin=``/``deepspeed_plugin=``/``megatron_lm_plugin=`` are
    aliases) and ``plugins`` (names of feature plugins to activate, and of installed device plugins
    asked to act, such as an optimising runtime). Settings not passed here come from
    ``DRIVETRAIN_*`` environment variables or the config file; a conflict raises (see docs/configuration.md).
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str | RNGType] | None = None,
        log_with: Any = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        backend: str | None = None,
        backend_config: Any = None,
        plugins: list[str] | tuple[str, ...] = (),
    ) -> None:
        #: what this Accelerator was asked for, checked and completed from the environment and config file
        self.settings = settings = AcceleratorSettings.resolve(
            **{k: v for k, v in locals().items() if k != "self"}
        )
        self.kwargs_handlers: list[KwargsHandler] = list(settings.kwargs_handlers)
        self.device_placement = settings.device_placement
        self.state = AcceleratorState(
            mixed_precision=settings.mixed_precision,
            cpu=settings.cpu,
            backend=settings.backend,
            backend_config=settings.backend_config,
            feature_plugins=settings.feature_plugins,
            dynamo_plugin=settings.dynamo_plugin,
            _from_accelerator=True,
            init_kwargs=settings.init_kwargs,
            parallelism_config=settings.parallelism_config,
        )
        self._plugins = self.state.plugins
        self.gradient_state = GradientState(settings.gradient_accumulation_plugin)
        self.dataloader_config = settings.dataloader_config
        self.step_scheduler_with_optimizer = settings.step_scheduler_with_optimizer
        self.project_configuration = settings.project_configuration
        self.rng_types = list(settings.rng_types)
        self.scaler = make_grad_scaler(self.state, self._handler(GradScalerKwargs))

        #: what prepare() has seen, in order (plugins and checkpoints read it)
        self.prepared = PreparedObjects()
        #: the user's optimizers that a plugin replaced by another object -> the replacement
        self._replaced_optimizers: dict[int, Any] = {}
        self._checkpointer: Checkpointer | None = None
        self.flag_tensor: torch.Tensor | None = None
        self.step = 0

        validate_log_with(log_with, logging_dir=self.logging_dir)
        self._log_with = log_with
        self.trackers: list[Any] = []

        check_handlers_have_their_plugin(get_plugin_registry(), self.kwargs_handlers, self._plugins.names)
        self._backward_hook = self._plugins.caller("backward")
        self._autocast_kwargs = (self._handler(AutocastKwargs) or AutocastKwargs()).to_kwargs()

    def __getstate__(self) -> dict[str, Any]:
        # Plugins are modules and the pre-resolved backward call a closure over pluggy's hook: neither
        # pickles. The stack is kept by its plugins' names and rebuilt where the Accelerator is unpickled.
        state = {
            key: value for key, value in self.__dict__.items() if key not in ("_backward_hook", "_plugins")
        }
        state["_plugin_names"] = list(self._plugins.names)
        if "_checkpointer" in state:
            state["_checkpointer"] = None  # built again on first use (it holds the plugin stack)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        names = state.pop("_plugin_names")
        self.__dict__.update(state)
        self._plugins = get_plugin_registry().stack(names)
        self._backward_hook = self._plugins.caller("backward")

    def _handler(self, handler_class: type) -> Any:
        """The user's kwargs handler of ``handler_class`` (or a subclass), or None."""
        return self.settings.handler(handler_class)

    def sharding_options(self, device_placement: bool) -> ShardingOptions:
        """How this process's share of a data loader is cut (the ``options`` of ``shard_dataloader``): the
        environment's data-parallel size and rank, and the ``dataloader_config`` settings."""
        from drivetrain.data.prepare import sharding_options

        return sharding_options(
            self.dataloader_config,
            self.state.environment,
            self.device,
            tuple(self.rng_types),
            device_placement,
        )

    if not TYPE_CHECKING:  # type checkers keep flagging misspelt attributes; plugin names are dynamic

        def __getattr__(self, name: str) -> Any:
            # Only called for names not found normally: those plugins registered for Accelerate's spellings
            # (registry.add_state_attribute(..., on_accelerator=True)), read from this Accelerator's state.
            if hasattr(type(self), name):
                return object.__getattribute__(self, name)  # a property failed: raise its own error
            if name.startswith("_") or "state" not in self.__dict__:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            from drivetrain.contract.exports import registered_attribute

            return registered_attribute(name, self.state, type(self).__name__, on_accelerator=True)

    # ---------------------------------------------------------------------------------------------------------
    # Where this process stands
    # ---------------------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def mixed_precision(self) -> str:
        return self.state.mixed_precision

    @property
    def backend_plugin(self) -> str:
        """The name of the drivetrain backend plugin in charge (``"local"``, ``"ddp"``, ...); torch's process-group
        backend (``"gloo"``, ``"nccl"``) is ``accelerator.state.backend``."""
        return self.state.backend_name

    @property
    def backend(self) -> str:
        """Alias of :attr:`backend_plugin`, the name scripts and plugins written before it use."""
        return self.state.backend_name

    @property
    def requested_plugins(self) -> tuple[str, ...]:
        """The plugins named in ``Accelerator(plugins=[...])``, in the order given."""
        return self.state.requested_plugins

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.plugin_kwargs["num_steps"] = steps

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(optimizer.step_was_skipped for optimizer in self.prepared.optimizers)

    def __repr__(self) -> str:
        return f"Accelerator(backend={self.backend_plugin!r}, device={self.device}, processes={self.num_processes})"

    # ---------------------------------------------------------------------------------------------------------
    # prepare
    # ---------------------------------------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and data loaders, returned in the order given.

        Models are prepared first, then optimizers (so they can be rebound to wrapped parameters), then
        schedulers and data loaders. ``device_placement`` has one flag per argument.
        """
        if device_placement is None:
            device_placement = [None] * len(args)  # type: ignore[list-item]
        elif len(device_placement) != len(args):
            raise ConfigurationError(
                f"device_placement has {len(device_placement)} entries but prepare() got {len(args)} objects"
            )
        results = list(args)
        prepared = self.prepared
        prepared.pending_optimizers = [obj for obj in args if kind_of(obj) == "optimizer"]
        prepared.pending_dataloaders = [obj for obj in args if kind_of(obj) == "dataloader"]
        try:
            for kind in ("model", "optimizer", "scheduler", "dataloader"):
                for index, (obj, placement) in enumerate(zip(args, device_placement)):
                    if kind_of(obj) == kind:
                        results[index] = self._prepare_one(kind, obj, placement)
                        # Accelerate's marker, which libraries built on it (transformers' Trainer) test.
                        with contextlib.suppress(AttributeError, TypeError):
                            results[index]._is_accelerate_prepared = True
        finally:
            prepared.pending_optimizers = []
            prepared.pending_dataloaders = []
        return results[0] if len(results) == 1 else tuple(results)

    def _prepare_one(self, kind: str, obj: Any, device_placement: bool | None) -> Any:
        if kind == "model":
            return self.prepare_model(obj, device_placement=device_placement)
        if kind == "optimizer":
            return self.prepare_optimizer(obj, device_placement=device_placement)
        if kind == "scheduler":
            return self.prepare_scheduler(obj)
        return self.prepare_data_loader(obj, device_placement=device_placement)

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Place ``model`` on the device, apply mixed precision and let the active plugins wrap it."""
        if any(model is prepared for prepared in self.prepared.models):
            return model  # prepared already: wrapping it again would double-wrap and double-count it
        check_trainable(model, lambda: is_bitsandbytes_multi_backend_available() and not is_xpu_available())
        if device_placement is None:
            device_placement = self.device_placement
        original = model
        backend_info = self.state.backend_info
        if device_placement and not backend_info.places_model and not spans_several_devices(model):
            model = model.to(self.device)
        if self.mixed_precision in ("fp16", "bf16") and ORIGINAL_FORWARD_ATTRIBUTE not in model.__dict__:
            patch_forward_with_autocast(model, self.autocast)
        model = self._plugins.call(
            "wrap_model", model=model, accelerator=self, evaluation_mode=evaluation_mode
        )
        remember_original(model, original)
        dynamo = self.state.dynamo_plugin
        if dynamo is not None and dynamo.enabled:
            model = torch.compile(model, **dynamo.to_compile_kwargs())  # type: ignore[assignment]
        self.prepared.models.append(model)
        return model

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> Any:
        """Let the active plugins rebind ``optimizer``, then wrap it in :class:`AcceleratedOptimizer`."""
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        given = optimizer
        optimizer = self._plugins.call("wrap_optimizer", optimizer=optimizer, accelerator=self)
        prepared = (
            optimizer
            if isinstance(optimizer, AcceleratedOptimizer)
            else AcceleratedOptimizer(optimizer, scaler=self.scaler)
        )
        if prepared.optimizer is not given:
            self._replaced_optimizers[id(given)] = prepared
        self.prepared.optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap ``scheduler`` so it steps with the optimizer steps that really happened."""
        if isinstance(scheduler, AcceleratedScheduler):
            return scheduler
        prepared = AcceleratedScheduler(
            scheduler,
            optimizers_stepping(scheduler, self.prepared.optimizers, self._replaced_optimizers),
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
        )
        self.prepared.schedulers.append(prepared)
        return prepared

    def prepare_data_loader(
        self, data_loader: Any, device_placement: bool | None = None, slice_fn_for_dispatch: Any = None
    ) -> Any:
        """Shard ``data_loader`` across processes and move its batches to the device."""
        if device_placement is None:
            device_placement = self.device_placement
        prepared = self._plugins.call(
            "shard_dataloader",
            dataloader=data_loader,
            accelerator=self,
            device_placement=device_placement,
            options=self.sharding_options(device_placement),
        )
        self.prepared.dataloaders.append(prepared)
        return prepared

    # Accelerate's private names of the prepared objects, which scripts written for it read; plugins use
    # ``accelerator.prepared``.
    @property
    def _models(self) -> list[torch.nn.Module]:
        return self.prepared.models

    @property
    def _optimizers(self) -> list[Any]:
        return self.prepared.optimizers

    @property
    def _schedulers(self) -> list[Any]:
        return self.prepared.schedulers

    @property
    def _dataloaders(self) -> list[Any]:
        return self.prepared.dataloaders

    @property
    def _custom_objects(self) -> list[Any]:
        return self.prepared.custom_objects

    @property
    def pending_optimizers(self) -> list[Any]:
        """Contract 1.0's name of ``prepared.pending_optimizers`` (kept for plugins written for it)."""
        return self.prepared.pending_optimizers

    @property
    def pending_dataloaders(self) -> list[Any]:
        """Contract 1.0's name of ``prepared.pending_dataloaders`` (kept for plugins written for it)."""
        return self.prepared.pending_dataloaders

    @property
    def torch_device_mesh(self) -> Any:
        """The run's ``DeviceMesh`` with named dimensions when the backend built one (N-D parallelism),
        else None."""
        return self.state.environment.device_mesh

    # -- N-D parallelism (docs/nd-parallelism.md) -------------------------------------------------------------
    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        """The run's ``ParallelismConfig`` (the script's, or the one built from launch flags / the config
        file), or None."""
        return self.state.parallelism_config

    def _mesh_rank(self, dimension: str, what: str) -> int:
        config = self.parallelism_config
        if config is None:
            raise RuntimeError(f"{what} is not configured: pass Accelerator(parallelism_config=...) first")
        if not config.size_of(dimension) > 1:
            return 0
        return self.torch_device_mesh.get_local_rank(dimension)

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's coordinate on the ``tp`` dimension (0 when tensor parallelism is off)."""
        return self._mesh_rank("tp", "tensor parallelism")

    @property
    def context_parallel_rank(self) -> int:
        """This process's coordinate on the ``cp`` dimension (0 when context parallelism is off)."""
        return self._mesh_rank("cp", "context parallelism")

    @property
    def data_parallel_rank(self) -> int:
        """This process's coordinate on the ``dp_replicate`` dimension (0 when it is off)."""
        return self._mesh_rank("dp_replicate", "data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's coordinate on the ``dp_shard`` dimension (0 when it is off)."""
        return self._mesh_rank("dp_shard", "shard-based data parallelism")

    @property
    def pipeline_parallel_rank(self) -> int:
        raise NotImplementedError("pipeline parallelism is not supported (as in Accelerate)")

    # ---------------------------------------------------------------------------------------------------------
    # The training step
    # ---------------------------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward pass: divides the loss by the accumulation steps, scales it in fp16, and lets the
        backend run it (``loss.backward()`` for most, the engine for DeepSpeed)."""
        steps = self.gradient_state.plugin_kwargs.get("num_steps", 1)
        if steps > 1:
            loss = loss / steps
        self._backward_hook(loss=loss, accelerator=self, backward_kwargs=kwargs)

    def _do_sync(self) -> None:
        state = self.gradient_state
        if state.sync_with_dataloader and state.end_of_dataloader:
            self.step = 0
            state._set_sync_gradients(True)
        else:
            self.step += 1
            state._set_sync_gradients(self.step % state.num_steps == 0)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Run one forward/backward of gradient accumulation: gradients synchronise (and the prepared
        optimizer steps) only every ``gradient_accumulation_steps`` batches and at the end of the loader."""
        self._do_sync()
        allow_sync = self.sync_gradients or (self.use_distributed and self.gradient_state.sync_each_batch)
        with contextlib.ExitStack() as stack:
            if not allow_sync:
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skip gradient synchronisation in this block (the backend's ``model.no_sync()`` when it has one)."""
        context = getattr(model, "no_sync", None) if self.use_distributed else None
        with context() if context is not None else contextlib.nullcontext():
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Force gradient synchronisation in the next backward even inside ``no_sync`` (backends whose
        wrapped model provides ``trigger_sync_in_backward()``; a no-op elsewhere)."""
        trigger = getattr(model, "trigger_sync_in_backward", None) if self.use_distributed else None
        with trigger() if trigger is not None else contextlib.nullcontext():
            yield

    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Train on data loaders whose ranks see different numbers of batches (torch's ``Join``)."""
        from drivetrain.data.samplers import join_uneven_inputs

        return join_uneven_inputs(
            joinables,
            self.prepared.dataloaders,
            even_batches,
            self.use_distributed,
            self.distributed_type,
            self.backend_plugin,
        )

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Any:
        """Context manager: run the block in the Accelerator's mixed precision."""
        kwargs = autocast_handler.to_kwargs() if autocast_handler is not None else self._autocast_kwargs
        return self._plugins.call("autocast", accelerator=self, autocast_kwargs=kwargs)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide gradients by the fp16 loss scale (before clipping or inspecting them)."""
        unscale_gradients(self.scaler, optimizer, self.prepared.optimizers)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Clip gradients by their global norm (across shards and processes); returns the norm."""
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        parameters = list(parameters)
        if self.sync_gradients:
            self.unscale_gradients()
        return self._plugins.call(
            "clip_grad_norm", parameters=parameters, max_norm=max_norm, norm_type=norm_type, accelerator=self
        )

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clamp every gradient to ``[-clip_value, clip_value]``."""
        if self.sync_gradients:
            self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's own module inside whatever the plugins (and torch.compile) wrapped it in."""
        return extract_model_from_parallel(model, keep_fp32_wrapper, keep_torch_compile)

    # ---------------------------------------------------------------------------------------------------------
    # Checkpoints (the work is in checkpoint/checkpointer.py; see docs/checkpointing.md)
    # ---------------------------------------------------------------------------------------------------------
    def save_state(
        self,
        output_dir: str | os.PathLike | None = None,
        safe_serialization: bool = True,
        blocking: bool | None = None,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, GradScaler, RNG states, data loader positions and registered
        objects into one folder, atomically; returns the folder. See :meth:`Checkpointer.save_state`."""
        return self.checkpointer.save_state(
            output_dir, safe_serialization, blocking, **save_model_func_kwargs
        )

    def load_state(
        self,
        input_dir: str | os.PathLike | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> str:
        """Restore everything :meth:`save_state` wrote, after checking every file against the manifest;
        returns the folder loaded. See :meth:`Checkpointer.load_state`."""
        return self.checkpointer.load_state(input_dir, load_kwargs, **kwargs)

    @property
    def checkpointer(self) -> Checkpointer:
        """This Accelerator's :class:`~drivetrain.checkpoint.checkpointer.Checkpointer` (built on first use,
        so that a script that never saves loads no checkpoint code)."""
        if self._checkpointer is None:
            from drivetrain.checkpoint.checkpointer import Checkpointer

            self._checkpointer = Checkpointer(self, self._plugins, self.prepared, self.project_configuration)
        return self._checkpointer

    def wait_for_checkpoint(self) -> None:
        """Wait until the last :meth:`save_state` is complete on disk (collective)."""
        if self._checkpointer is not None:
            self._checkpointer.wait_for_checkpoint()

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load ``objects`` with every checkpoint (each needs ``state_dict`` and ``load_state_dict``)."""
        self.checkpointer.register_for_checkpointing(*objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in :meth:`save_state` before anything is written."""
        return self.checkpointer.register_save_state_pre_hook(hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in :meth:`load_state` before anything is read."""
        return self.checkpointer.register_load_state_pre_hook(hook)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The full state dict of a prepared model (gathered from the shards of a sharded backend)."""
        return self.checkpointer.get_state_dict(model, unwrap=unwrap)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write ``model``'s weights into ``save_directory`` (one file, or shards with an index)."""
        self.checkpointer.save_model(model, save_directory, max_shard_size, safe_serialization)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save`` (or safetensors) once per machine set, atomically."""
        self.checkpointer.save(obj, f, safe_serialization=safe_serialization)

    # ---------------------------------------------------------------------------------------------------------
    # Collectives and process control (thin: the work is in operations.py and state.py)
    # ---------------------------------------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (or a nested structure of tensors) from every process along dim 0."""
        return operations.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Like :meth:`gather`, minus the samples duplicated to even out the last batch."""
        return operations.gather_for_metrics(
            input_data,
            use_gather_object=use_gather_object,
            state=self.state.partial_state,
            gradient_state=self.gradient_state,
        )

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        return operations.reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        return operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Any:
        return self.state.partial_state.split_between_processes(inputs, apply_padding=apply_padding)

    def wait_for_everyone(self) -> None:
        """Meet every other process here; a :meth:`save_state` still finishing in the background is
        completed first, so the checkpoint folder exists on every process afterwards."""
        self.wait_for_checkpoint()
        self.state.partial_state.wait_for_everyone()

    def main_process_first(self) -> Any:
        return self.state.partial_state.main_process_first()

    def local_main_process_first(self) -> Any:
        return self.state.partial_state.local_main_process_first()

    def on_main_process(self, function: Callable) -> Callable:
        return self.state.partial_state.on_main_process(function)

    def on_local_main_process(self, function: Callable) -> Callable:
        return self.state.partial_state.on_local_main_process(function)

    def on_last_process(self, function: Callable) -> Callable:
        return self.state.partial_state.on_last_process(function)

    def on_process(self, function: Callable | None = None, process_index: int | None = None) -> Callable:
        return self.state.partial_state.on_process(function, process_index=process_index)

    def on_local_process(
        self, function: Callable | None = None, local_process_index: int | None = None
    ) -> Callable:
        return self.state.partial_state.on_local_process(function, local_process_index=local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine."""
        self.state.partial_state.print(*args, **kwargs)

    def set_trigger(self) -> None:
        """Raise a flag on this process that :meth:`check_trigger` sees on every process."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every process when any process called :meth:`set_trigger` (then lowers the flag)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        flags = operations.reduce(self.flag_tensor, reduction="sum")
        if int(flags.item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    # ---------------------------------------------------------------------------------------------------------
    # Data and memory
    # ---------------------------------------------------------------------------------------------------------
    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A data loader that starts ``num_batches`` batches into ``dataloader`` (resume mid-epoch)."""
        from drivetrain.data import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    def free_memory(self, *objects: Any) -> list[Any]:
        """Forget every prepared object (and ``objects``), then free cached device memory."""
        self.prepared.clear()
        self._replaced_optimizers.clear()
        self.step = 0
        released = [None for _ in objects]
        gc.collect()
        empty_device_cache()
        return released

    def clear(self, *objects: Any) -> list[Any]:
        """Alias of :meth:`free_memory`."""
        return self.free_memory(*objects)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when ``model`` was dispatched across several devices with a device map (such a model must
        not be wrapped for data parallel training)."""
        return any(spans_several_devices(module) for module in model.modules())

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """Shard ``buffers`` (inputs, labels, position tables) along their sequence dimensions
        ``buffer_seq_dims`` over the ``cp`` dimension for the block, and run attention in the block as ring
        attention across those ranks; the buffers are restored on exit unless in ``no_restore_buffers``.
        Enter it anew for every step. The backend provides it (``DistributedEnvironment.context_parallel``);
        without context parallelism the block runs unchanged and a warning says so once."""
        context = self.state.environment.context_parallel
        if context is None:
            _warn_once(
                "maybe_context_parallel has no effect: context parallelism is not enabled (set "
                "ParallelismConfig(cp_size=...) > 1 with a backend that supports it)"
            )
            yield
            return
        with context(buffers=buffers, buffer_seq_dims=buffer_seq_dims, no_restore_buffers=no_restore_buffers):
            yield

    def end_training(self) -> None:
        """Finish every tracker, then meet the other processes and tear the process group down (a run that
        ends without it may abort at exit with gloo). Call once, at the end of a script. A save still
        finishing in the background is completed first."""
        self.wait_for_checkpoint()
        super().end_training()
        self.state.partial_state.destroy_process_group()


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=4)


def __getattr__(name: str) -> Any:
    # Accelerate's module logger, made when asked for
    if name == "logger":
        from drivetrain.logging import get_logger

        return get_logger(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
