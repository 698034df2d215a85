"""What hooks receive: the Accelerator as plugins see it (``PluginAccelerator``) and the objects the kernel
hands them besides it. Part of the plugin API (see docs/plugins/api.md)."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch

from drivetrain.config.enums import DistributedType


@dataclasses.dataclass(frozen=True)
class ShardingOptions:
    """How ``shard_dataloader`` should shard a data loader: this process's share of the data and the user's
    ``DataLoaderConfiguration``. ``prepare_data_loader(dataloader, **options.to_kwargs())`` is the reference
    behaviour; ``dataclasses.replace(options, num_processes=..., process_index=...)`` shards over a group."""

    device: torch.device
    #: number of shares of the data (the data-parallel size) and this process's share
    num_processes: int = 1
    process_index: int = 0
    split_batches: bool = False
    put_on_device: bool = True
    rng_types: tuple[str, ...] = ("generator",)
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def to_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``prepare_data_loader``."""
        kwargs = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        kwargs["rng_types"] = list(self.rng_types)
        return kwargs


@dataclasses.dataclass
class PreparedObjects:
    """What ``Accelerator.prepare`` has seen, in order: ``accelerator.prepared``. Plugins read it (FSDP numbers
    every model of a checkpoint, DeepSpeed reads the batch size of the prepared loaders); only the kernel
    changes it."""

    models: list[torch.nn.Module] = dataclasses.field(default_factory=list)
    #: ``AcceleratedOptimizer`` objects
    optimizers: list[Any] = dataclasses.field(default_factory=list)
    #: ``AcceleratedScheduler`` objects
    schedulers: list[Any] = dataclasses.field(default_factory=list)
    dataloaders: list[Any] = dataclasses.field(default_factory=list)
    #: objects given to ``register_for_checkpointing``
    custom_objects: list[Any] = dataclasses.field(default_factory=list)
    #: the optimizers and data loaders of the ``prepare()`` call in progress: models are wrapped first, and a
    #: backend may need them then (DeepSpeed builds its engine with the optimizer and reads the batch size)
    pending_optimizers: list[Any] = dataclasses.field(default_factory=list)
    pending_dataloaders: list[Any] = dataclasses.field(default_factory=list)

    def clear(self) -> None:
        """Forget everything (``Accelerator.free_memory``)."""
        for objects in (self.models, self.optimizers, self.schedulers, self.dataloaders):
            objects.clear()


class PluginAccelerator(Protocol):
    """The :class:`~drivetrain.Accelerator` as plugins see it: hooks receive the Accelerator (argument
    ``accelerator``), and these attributes and methods are the part of it that is plugin API. Anything else,
    underscore names above all, may change without notice."""

    @property
    def device(self) -> torch.device: ...

    @property
    def backend_plugin(self) -> str:
        """The name of the distribution backend plugin in charge (``"local"``, ``"ddp"``, ...); torch's
        process-group backend is ``state.backend``"""

    @property
    def backend(self) -> str:
        """Alias of ``backend_plugin`` (contract 1.1's name, kept)"""

    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"``, ``"bf16"``, ``"fp8"``"""

    @property
    def num_processes(self) -> int: ...

    @property
    def distributed_type(self) -> DistributedType:
        """What the backend's ``setup_process_group`` reported (``DistributedType.MULTI_CPU``, ...)"""

    @property
    def process_index(self) -> int: ...

    @property
    def local_process_index(self) -> int: ...

    @property
    def is_main_process(self) -> bool: ...

    @property
    def is_local_main_process(self) -> bool: ...

    @property
    def state(self) -> Any:
        """The ``AcceleratorState``: ``backend_config``, ``mixed_precision``, ``environment``"""

    @property
    def gradient_state(self) -> Any: ...

    @property
    def sync_gradients(self) -> bool: ...

    @property
    def gradient_accumulation_steps(self) -> int: ...

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        """A backend whose own configuration sets the accumulation steps (DeepSpeed's config) hands them to
        the Accelerator, as Accelerate does."""

    @property
    def requested_plugins(self) -> tuple[str, ...]:
        """The plugin names the script passed in ``Accelerator(plugins=[...])``. Device plugins are active
        whenever they are installed; one that changes training acts only when named here or asked
        through its own launch option or config key."""

    @property
    def kwargs_handlers(self) -> list[Any]:
        """The ``KwargsHandler`` objects the user passed (a plugin finds its own by type)"""

    @property
    def scaler(self) -> Any:
        """The ``torch.amp.GradScaler`` with fp16, else None"""

    @property
    def project_configuration(self) -> Any: ...

    @property
    def dataloader_config(self) -> Any: ...

    @property
    def device_placement(self) -> bool: ...

    @property
    def split_batches(self) -> bool: ...

    @property
    def prepared(self) -> PreparedObjects:
        """What ``prepare`` has seen"""

    @property
    def torch_device_mesh(self) -> Any:
        """The run's ``DeviceMesh`` when the backend built one, else None"""

    @property
    def parallelism_config(self) -> Any:
        """The run's ``ParallelismConfig`` (sizes and handlers of the parallel dimensions), or None"""

    #: the step counter that checkpoints save and restore (``load_state`` sets it)
    step: int

    def autocast(self, autocast_handler: Any = None) -> Any:
        """The context manager the forward pass runs under (the ``autocast`` hook's answer)."""

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's module inside whatever the plugins wrapped it in.

        The rule a wrapper follows: none. ``prepare`` records, on the model that the ``wrap_model`` chain
        returns, the module the script passed in, so a backend's wrapper needs no ``module`` attribute and
        no base class; ``unwrap_model`` follows that record (through ``torch.compile`` too). Outside
        ``prepare`` only torch's ``DistributedDataParallel`` and ``DataParallel`` are peeled (their
        ``module``)."""

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The full state dict of a prepared model."""

    def sharding_options(self, device_placement: bool) -> ShardingOptions:
        """How this process's share of a data loader is cut (what ``shard_dataloader`` receives)."""
