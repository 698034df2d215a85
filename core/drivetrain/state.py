"""Process-wide state: which process this is, its device, the backend in charge, and gradient sync.

``PartialState()`` can be built anywhere (scripts use it for inference without an Accelerator) and every
instance shares the same state, like Accelerate's. Unlike a hidden singleton, it can be reset:
``PartialState._reset_state()`` (or :func:`drivetrain.reset_state`) forgets it, and building it again with
other settings picks another backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from drivetrain.bootstrap import bootstrap, fit_parallelism, join_process_group, report_backend
from drivetrain.config import sources
from drivetrain.config.enums import DistributedType, PrecisionType
from drivetrain.contract.calling import PluginStack
from drivetrain.contract.environment import Collectives, DistributedEnvironment, environment_world_size
from drivetrain.contract.info import PluginInfo
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.contract.selection import (
    AUTOMATIC_SOURCES,
    backend_of_config,
    precision_plugin,
    select_backend,
)
from drivetrain.errors import ConfigurationError

__all__ = [
    "AcceleratorState",
    "DistributedEnvironment",
    "GradientState",
    "PartialState",
    "environment_world_size",
    "reset_state",
]


def _shared_state_object(cls: Any) -> Any:
    """The process's ``cls`` state object, without initialising anything: what a pickled state object
    unpickles as. The state objects are views of process-wide state (devices, process groups, plugin
    modules), so a pickled one stands for "this process's state" (Accelerate's users pickle Accelerators)."""
    state = cls.__new__(cls)
    state.__dict__ = cls._shared_state  # type: ignore[attr-defined]
    return state


#: What ``PartialState.__init__`` sets up (and ``_reset_state`` forgets).
_PARTIAL_STATE_FIELDS = frozenset(
    {
        "backend_name",
        "backend_info",
        "backend_source",
        "backend_config",
        "parallelism_config",
        "device_plugins",
        "cpu",
        "device",
        "environment",
        "debug",
        "fork_launched",
    }
)


class PartialState:
    """The process's place in the run: device, ranks, backend and collectives.

    Attributes: ``device``, ``num_processes``, ``process_index``, ``local_process_index``,
    ``is_main_process``, ``is_local_main_process``, ``is_last_process``, ``distributed_type``,
    ``use_distributed``, ``backend`` (torch.distributed backend string), ``backend_name`` (the drivetrain
    plugin), ``collectives``, ``debug``.
    """

    _shared_state: dict[str, Any] = {}
    #: What is worked out once per run and forgotten with the state: each backend's resolved configuration
    #: (``plugin_api.resolve_backend_config``), as (backend, the script's object, the launcher's and config
    #: file's variables, the configuration).
    resolved_backend_configs: list[tuple[str, Any, Any, Any]] = []

    def __reduce__(self) -> tuple[Any, tuple[type]]:
        return _shared_state_object, (type(self),)

    def __init__(
        self, cpu: bool = False, backend: str | None = None, backend_config: Any = None, **kwargs: Any
    ):
        self.__dict__ = self._shared_state
        # `timeout` goes to torch.distributed.init_process_group, as in Accelerate (transformers' TrainingArguments
        # passes its ddp_timeout so); `init_kwargs` (InitProcessGroupKwargs) wins over it.
        init_kwargs = {
            **{k: kwargs.pop(k) for k in ("timeout",) if k in kwargs},
            **(kwargs.pop("init_kwargs", None) or {}),
        }
        parallelism = kwargs.pop("parallelism_config", None)
        if kwargs:
            raise TypeError(f"PartialState got unexpected arguments: {', '.join(sorted(kwargs))}")
        if _names_torch_backend(backend):
            # Accelerate's PartialState(backend=) is torch.distributed's backend (transformers passes its
            # TrainingArguments.ddp_backend so); drivetrain's names a plugin. A torch backend's name that is no
            # plugin's goes to init_process_group, and the plugin is chosen as if none were named.
            init_kwargs.setdefault("backend", backend)
            backend = None
        if self.initialized:
            self._check_compatible(backend, backend_config, cpu, parallelism)
            return
        setup = bootstrap(
            cpu=cpu,
            backend=backend,
            backend_config=backend_config,
            init_kwargs=init_kwargs,
            parallelism=parallelism,
        )
        self.backend_name: str = setup.backend_name
        #: the backend's PluginInfo (what it declares: places_model, manages_precision, ...)
        self.backend_info: PluginInfo = setup.backend_info
        self.backend_source: str = setup.backend_source
        self.backend_config: Any = backend_config
        self.parallelism_config: Any = setup.parallelism_config
        self.device_plugins: list[str] = setup.device_plugins
        self.cpu: bool = setup.cpu
        self.device: torch.device = setup.device
        self.environment: DistributedEnvironment = setup.environment
        self.debug: bool = sources.resolve("debug_mode", default=False, convert=sources.to_bool).value
        self.fork_launched: bool = sources.env_flag("FORK_LAUNCHED")

    # -- lifecycle --------------------------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return "environment" in self._shared_state

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found: the state set up in __init__ is gone after _reset_state().
        # (A property reading that state, ``num_processes``, lands here too, under its own name.)
        known = name in _PARTIAL_STATE_FIELDS or hasattr(type(self), name)
        if known and "environment" not in self._shared_state:
            raise AttributeError(
                f"`PartialState` object has no attribute {name!r}. This happens if `PartialState._reset_state()` "
                "was called and an `Accelerator` or `PartialState` was not built again since: build one first"
            )
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")

    def _check_compatible(
        self, backend: str | None, backend_config: Any, cpu: bool, parallelism: Any
    ) -> None:
        wanted = backend_of_config(backend_config) if backend_config is not None else backend
        # Before any Accelerator was built, a backend chosen automatically is a default, not a setting.
        named_first = self.backend_source.startswith(AUTOMATIC_SOURCES) and not AcceleratorState._shared_state
        if wanted is not None and wanted != self.backend_name and named_first:
            self._take_backend(backend, backend_config)
        elif wanted is not None and wanted != self.backend_name:
            raise ConfigurationError(
                f"this process already runs backend {self.backend_name!r} (from {self.backend_source}); "
                f"a new Accelerator asks for {wanted!r}. Call drivetrain.reset_state() first to switch backends "
                "in one process"
            )
        # A process set up with cpu=True keeps the device its backend chose for it (the xla backend: torch_xla's
        # CPU device).
        if cpu and not self.cpu and self.device.type != "cpu":
            raise ConfigurationError(
                f"this process already computes on {self.device}; cpu=True needs drivetrain.reset_state() first"
            )
        if parallelism is not None and parallelism is not self.parallelism_config:
            # The mesh is built once per process; a new Accelerator may bring its own config object (handlers,
            # a tensor-parallel plan) as long as its sizes are the ones the mesh was built for.
            fit_parallelism(parallelism, self.backend_name, self.backend_info)
            ours = self.parallelism_config.sizes() if self.parallelism_config is not None else "none"
            if parallelism.sizes() != ours:
                raise ConfigurationError(
                    f"this process already runs with parallelism {ours}; a new Accelerator asks for "
                    f"{parallelism.sizes()}. The device mesh is built once per process: call "
                    "drivetrain.reset_state() first to change it"
                )
            parallelism.device_mesh = self.parallelism_config.device_mesh
            self.parallelism_config = parallelism

    def _take_backend(self, backend: str | None, backend_config: Any) -> None:
        """The first Accelerator names the backend of a process whose state was set up before anything said
        which (transformers' TrainingArguments builds a PartialState, then its Trainer an Accelerator with
        ``deepspeed_plugin=`` or ``fsdp_plugin=``): the automatic choice was a default, not a setting, so the
        named backend joins the process group already there and takes over, as Accelerate's AcceleratorState
        turns a PartialState's distributed type into DEEPSPEED or FSDP. Once an Accelerator was built on the
        automatic backend, another one is an error (prepared objects may hold the first one's wrappers)."""
        manager = get_plugin_registry()
        selection = select_backend(manager, backend, backend_config)
        stack = manager.stack([*self.device_plugins, selection.value])
        environment = join_process_group(
            stack, selection.value, self.device, {}, self.parallelism_config, backend_config
        )
        self.backend_name = selection.value
        self.backend_info = manager.info(selection.value)
        self.backend_source = f"{selection.source}, after {self.backend_source}"
        self.backend_config = backend_config
        self.environment = environment
        report_backend(self.backend_name, self.backend_source, environment)

    @classmethod
    def _reset_state(cls, destroy_process_group: bool = False) -> None:
        """Forget the shared state. With ``destroy_process_group``, also tear the process group down."""
        environment = cls._shared_state.get("environment")
        if destroy_process_group and environment is not None and environment.shutdown is not None:
            environment.shutdown()
        cls._shared_state.clear()
        cls.resolved_backend_configs.clear()

    def destroy_process_group(self, group: Any = None) -> None:
        """Meet the other ranks and tear the process group down (safe to call twice). With ``group``, only
        that subgroup is destroyed."""
        if group is not None:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group(group)
            return
        environment = self.environment
        if environment.shutdown is not None:
            environment.shutdown()
            environment.shutdown = None

    # -- where this process stands ------------------------------------------------------------------------------
    @property
    def num_processes(self) -> int:
        return self.environment.num_processes

    @property
    def process_index(self) -> int:
        return self.environment.process_index

    @property
    def local_process_index(self) -> int:
        return self.environment.local_process_index

    @property
    def distributed_type(self) -> DistributedType:
        return self.environment.distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType) -> None:
        # Scripts written for Accelerate relabel the state (tests of code paths for other setups); the
        # label is shared by every state object of the process, as the environment is.
        self.environment.distributed_type = DistributedType(value)

    @property
    def backend(self) -> str | None:
        return self.environment.torch_backend

    @property
    def collectives(self) -> Collectives:
        return self.environment.collectives

    @property
    def device_mesh(self) -> Any:
        """The run's ``DeviceMesh`` when the backend built one (N-D parallelism), else None."""
        return self.environment.device_mesh

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        return self.device

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}{' (debug mode)' if self.debug else ''}\n"
            f"Backend: {self.backend_name} (torch.distributed: {self.backend})\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    # -- synchronisation ----------------------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        if self.num_processes > 1:
            self.collectives.barrier()

    @contextlib.contextmanager
    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others (e.g. download then read)."""
        with self._goes_first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Like :meth:`main_process_first`, once per machine."""
        with self._goes_first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of ``inputs`` (list, tuple, dict of equal-length values,
        or tensor). Earlier processes get one more element when the length does not divide evenly; with
        ``apply_padding`` every process gets the same count, padded with the last element."""
        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding)

    # -- running code on some processes only -------------------------------------------------------------------
    def on_main_process(self, function: Callable) -> Callable:
        """Decorator: run ``function`` only on the main process."""
        return _only_if(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable) -> Callable:
        return _only_if(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable) -> Callable:
        return _only_if(function, lambda: self.is_last_process)

    def on_process(self, function: Callable | None = None, process_index: int | None = None) -> Callable:
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _only_if(function, lambda: self.process_index == process_index)

    def on_local_process(
        self, function: Callable | None = None, local_process_index: int | None = None
    ) -> Callable:
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return _only_if(function, lambda: self.local_process_index == local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine (on the local main process)."""
        if self.is_local_main_process:
            print(*args, **kwargs)


def _only_if(function: Callable, condition: Callable[[], bool]) -> Callable:
    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        if condition():
            return function(*args, **kwargs)
        return None

    return run


def split_for_process(
    inputs: Any, num_processes: int, process_index: int, apply_padding: bool = False
) -> Any:
    """The share of ``inputs`` that process ``process_index`` of ``num_processes`` gets."""
    if num_processes == 1:
        return inputs
    if isinstance(inputs, dict):
        lengths = {len(value) for value in inputs.values()}
        if len(lengths) > 1:
            raise ValueError("split_between_processes needs every value of the dict to have the same length")
        return {
            key: split_for_process(value, num_processes, process_index, apply_padding)
            for key, value in inputs.items()
        }
    length = len(inputs)
    per_process, extra = divmod(length, num_processes)
    start = process_index * per_process + min(process_index, extra)
    end = start + per_process + (1 if process_index < extra else 0)
    if _is_row_table(inputs):
        # A `datasets.Dataset` sliced gives a dict of columns, not rows: pick the rows by index instead.
        indices = list(range(start, end))
        if apply_padding:
            indices += [length - 1] * (math.ceil(length / num_processes) - len(indices))
        return inputs.select(indices)
    share = inputs[start:end]
    if apply_padding:
        target = math.ceil(length / num_processes)
        missing = target - (end - start)
        if missing > 0:
            last = inputs[-1:]  # Accelerate pads with the input's last element, not the share's
            if isinstance(inputs, torch.Tensor):
                share = torch.cat([share, last.repeat(missing, *([1] * (inputs.dim() - 1)))])
            else:
                share = share + type(share)(list(last) * missing)
    return share


def _is_row_table(inputs: Any) -> bool:
    """A table of rows that slicing turns into columns (``datasets.Dataset``): it has ``select`` (rows by
    index) and ``column_names``; a list, tuple or tensor has neither."""
    return callable(getattr(inputs, "select", None)) and hasattr(inputs, "column_names")


class AcceleratorState:
    """Per-run settings on top of :class:`PartialState`: precision, backend configuration, active plugins.

    Shared by every instance, like PartialState. Building a new ``Accelerator`` replaces these settings
    (a second Accelerator with other settings works); unknown attributes are looked up on PartialState.
    """

    _shared_state: dict[str, Any] = {}

    def __reduce__(self) -> tuple[Any, tuple[type]]:
        return _shared_state_object, (type(self),)

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        backend: str | None = None,
        backend_config: Any = None,
        feature_plugins: tuple[str, ...] = (),
        dynamo_plugin: Any = None,
        _from_accelerator: bool = False,
        **kwargs: Any,
    ) -> None:
        self.__dict__ = self._shared_state
        if self.initialized and not _from_accelerator:
            return
        self.partial_state = PartialState(cpu=cpu, backend=backend, backend_config=backend_config, **kwargs)
        precision = sources.resolve(
            "mixed_precision", mixed_precision, default="no", convert=_check_precision
        )
        self.mixed_precision: str = precision.value
        self.backend_config = (
            backend_config if backend_config is not None else self.partial_state.backend_config
        )
        self.dynamo_plugin = dynamo_plugin
        manager = get_plugin_registry()
        provider = precision_plugin(manager, self.mixed_precision)
        #: the plugins the script named (``Accelerator(plugins=[...])``): a device plugin is active whenever it
        #: is installed, and changes what it does only when asked (named here, or by its own options)
        self.requested_plugins: tuple[str, ...] = tuple(dict.fromkeys(feature_plugins))
        names = [*self.partial_state.device_plugins, *feature_plugins, *([provider] if provider else [])]
        self.plugins: PluginStack = manager.stack([*names, self.partial_state.backend_name])

    @property
    def initialized(self) -> bool:
        return "partial_state" in self._shared_state

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        cls._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()

    def destroy_process_group(self, group: Any = None) -> None:
        """:meth:`PartialState.destroy_process_group`; works after ``_reset_state()`` too, since the process
        group belongs to PartialState (scripts end with ``state.destroy_process_group()`` on an old state)."""
        PartialState().destroy_process_group(group)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found normally: delegate process facts to PartialState, then the
        # names plugins registered (registry.add_state_attribute, e.g. a backend's active configuration).
        if name in ("partial_state", "__setstate__"):
            raise AttributeError(name)
        if "partial_state" not in self._shared_state:
            raise AttributeError(
                f"`AcceleratorState` object has no attribute {name!r} yet. This happens if "
                "`AcceleratorState._reset_state()` was called and an `Accelerator` or `AcceleratorState` was not "
                "built again since: build one first"
            )
        try:
            return getattr(self._shared_state["partial_state"], name)
        except AttributeError:
            if hasattr(type(self._shared_state["partial_state"]), name):
                raise  # a property of PartialState failed: keep its own error
        from drivetrain.contract.exports import registered_attribute

        return registered_attribute(name, self, type(self).__name__)

    def __repr__(self) -> str:
        return repr(self.partial_state) + f"Mixed precision type: {self.mixed_precision}\n"


def initialized_accelerator_state() -> AcceleratorState | None:
    """The shared :class:`AcceleratorState` once an Accelerator (or AcceleratorState) was built in this
    process, else ``None``; never builds one (plugins asking "is a run configured yet?" must not start one)."""
    return AcceleratorState() if "partial_state" in AcceleratorState._shared_state else None


def _check_precision(value: Any) -> str:
    text = str(value).lower()
    if text not in PrecisionType.list():
        raise ConfigurationError(
            f"mixed_precision={value!r} is not valid; choose one of: {', '.join(PrecisionType.list())}"
        )
    return text


class GradientState:
    """Whether gradients synchronise on this step, and where the active data loader stands.

    Shared per process. Prepared data loaders register themselves while they iterate (``_add_dataloader``
    / ``_remove_dataloader``) and expose ``end_of_dataloader`` and ``remainder``, which this state reports
    for the innermost active loader.
    """

    _shared_state: dict[str, Any] = {}

    def __reduce__(self) -> tuple[Any, tuple[type]]:
        return _shared_state_object, (type(self),)

    def __init__(self, gradient_accumulation_plugin: Any = None) -> None:
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.sync_gradients = True
            # Weak references: a loader whose iteration was dropped midway (still registered, so that
            # gather_for_metrics sees its batch) is still freed with the objects that hold it.
            self._dataloader_weakrefs: list[weakref.ref | None] = [None]
            self.plugin_kwargs: dict[str, Any] = {}
        if gradient_accumulation_plugin is not None:
            # As Accelerate keeps them (the plugin's to_kwargs()): only the settings that differ from the
            # plugin's defaults; one left out reads as the property's default below (transformers checks that
            # `sync_each_batch` is absent unless asked for).
            defaults = type(gradient_accumulation_plugin)()
            self.plugin_kwargs = {
                field.name: getattr(gradient_accumulation_plugin, field.name)
                for field in dataclasses.fields(gradient_accumulation_plugin)
                if getattr(gradient_accumulation_plugin, field.name) != getattr(defaults, field.name)
            }

    @property
    def initialized(self) -> bool:
        return "sync_gradients" in self._shared_state

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()

    @property
    def num_steps(self) -> int:
        return self.plugin_kwargs.get("num_steps", 1)

    @property
    def adjust_scheduler(self) -> bool:
        return self.plugin_kwargs.get("adjust_scheduler", False)

    @property
    def sync_with_dataloader(self) -> bool:
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    @property
    def sync_each_batch(self) -> bool:
        return self.plugin_kwargs.get("sync_each_batch", False)

    @property
    def end_of_dataloader(self) -> bool:
        if not self.in_dataloader:
            return False
        return bool(self.active_dataloader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        if not self.in_dataloader:
            return -1
        return int(self.active_dataloader.remainder)

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    @property
    def dataloader_references(self) -> list[Any]:
        """The loaders being iterated, oldest first, after a leading ``None`` (a freed one reads ``None``)."""
        return [None if reference is None else reference() for reference in self._dataloader_weakrefs]

    @property
    def active_dataloader(self) -> Any:
        return self.dataloader_references[-1]

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def _add_dataloader(self, dataloader: Any) -> None:
        self._dataloader_weakrefs.append(weakref.ref(dataloader))

    def _remove_dataloader(self, dataloader: Any) -> None:
        references = self.dataloader_references
        if dataloader in references:
            del self._dataloader_weakrefs[references.index(dataloader)]

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n"
        )


def reset_state(destroy_process_group: bool = False) -> None:
    """Forget every piece of shared state (process, accelerator, gradient), e.g. between tests or before a
    second Accelerator with another backend."""
    AcceleratorState._reset_state()
    GradientState._reset_state()
    PartialState._reset_state(destroy_process_group=destroy_process_group)


#: torch.distributed's backends (and those of vendor packages) that Accelerate's PartialState(backend=) takes.
TORCH_DISTRIBUTED_BACKENDS = frozenset(
    {"gloo", "nccl", "mpi", "ucc", "xccl", "ccl", "hccl", "cncl", "mccl", "smddp"}
)


def _names_torch_backend(backend: str | None) -> bool:
    """Whether ``backend`` is torch.distributed's (``"gloo"``, ``"cpu:gloo,cuda:nccl"``) rather than a plugin's."""
    if not backend:
        return False
    names = [part.split(":")[-1] for part in backend.split(",")]
    if not all(name in TORCH_DISTRIBUTED_BACKENDS for name in names):
        return False
    return backend not in get_plugin_registry().names()


def is_initialized() -> bool:
    """Whether an ``AcceleratorState`` has been created in this process (Accelerate's ``state.is_initialized``)."""
    return bool(AcceleratorState._shared_state)


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Stands in for a method that must do nothing on this process (Accelerate's helper)."""
    return None


class ThreadLocalSharedDict(threading.local):
    """A dictionary per thread, used as a class attribute descriptor: Accelerate's shared state on runtimes where
    every thread drives its own device. ``SharedDict`` is this there, ``dict`` elsewhere."""

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[Any, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[Any, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[Any, Any]) -> None:
        self._storage = value


#: Accelerate's ``SharedDict``: the shared-state dictionary type (a plain dict on every runtime drivetrain runs).
SharedDict = dict


def __getattr__(name: str) -> Any:
    if name == "logger":  # Accelerate's module logger, made when asked for
        import importlib

        # drivetrain.logging reads this module's state: imported by name so the two do not import each other
        return importlib.import_module("drivetrain.logging").get_logger(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
