"""How a process joins a run, in the order it happens: select the backend, detect the device, select again
for that device, join the process group, attach the mesh, report.

``PartialState()`` calls :func:`bootstrap` once per process (again only after ``reset_state()``) and keeps
the :class:`ProcessSetup` it returns; nothing here is stored anywhere else.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain.config import process_env, sources
from drivetrain.config.parallelism import DATA_PARALLEL_DIMENSIONS, ParallelismConfig, warn_unused_handlers
from drivetrain.contract.calling import PluginStack
from drivetrain.contract.environment import DistributedEnvironment, environment_world_size
from drivetrain.contract.info import PluginInfo
from drivetrain.contract.registry import PluginRegistry, get_plugin_registry
from drivetrain.contract.selection import AUTOMATIC_SOURCES, select_backend
from drivetrain.errors import ConfigurationError, PluginError

#: Variables that pin this process's device (``cuda:3``), overriding what the device plugins detect;
#: Accelerate's name is honoured for scripts and launchers written for it.
DEVICE_OVERRIDE_ENV = ("DRIVETRAIN_TORCH_DEVICE", "ACCELERATE_TORCH_DEVICE")


@dataclasses.dataclass(frozen=True)
class ProcessSetup:
    """What :func:`bootstrap` settled for this process (``PartialState`` keeps it field by field)."""

    backend_name: str
    #: where the backend choice came from (``"Accelerator(backend=...)"``, ``"automatic (...)"``, ...)
    backend_source: str
    backend_info: PluginInfo
    #: the device plugins active in every run (``drivetrain.devices`` entry points)
    device_plugins: list[str]
    cpu: bool
    device: torch.device
    environment: DistributedEnvironment
    parallelism_config: ParallelismConfig | None


def bootstrap(
    *,
    cpu: bool = False,
    backend: str | None = None,
    backend_config: Any = None,
    init_kwargs: Mapping[str, Any] | None = None,
    parallelism: ParallelismConfig | None = None,
) -> ProcessSetup:
    """Set this process up for a run: the steps below, each a function of its own, in the order they run."""
    place = process_env.process_place()  # the launcher's variables, checked before anything is set up
    manager = get_plugin_registry()
    selection = select_backend(manager, backend, backend_config)
    parallelism = fit_parallelism(parallelism, selection.value, manager.info(selection.value))
    cpu_setting = sources.resolve(
        "cpu", True if cpu else None, script_source="cpu=True", default=False, convert=sources.to_bool
    )
    device_plugins = manager.device_plugins()
    device = detect_device(
        manager.stack([*device_plugins, selection.value]), cpu_setting.value, place.local_rank
    )
    if selection.source.startswith(AUTOMATIC_SOURCES):
        selection = backend_for_device(manager, selection, device.type)
    environment = join_process_group(
        manager.stack([*device_plugins, selection.value]),
        selection.value,
        device,
        init_kwargs or {},
        parallelism,
        backend_config,
    )
    attach_mesh(parallelism, environment)
    report(selection.value, selection.source, environment)
    return ProcessSetup(
        backend_name=selection.value,
        backend_source=selection.source,
        backend_info=manager.info(selection.value),
        device_plugins=device_plugins,
        cpu=cpu_setting.value,
        device=device,
        environment=environment,
        parallelism_config=parallelism,
    )


def fit_parallelism(
    parallelism: ParallelismConfig | None, backend: str, info: PluginInfo
) -> ParallelismConfig | None:
    """The run's parallelism (the script's, else the environment's) fitted to ``backend`` before the process
    group exists: a ``ParallelismConfig()`` of all ones takes every process in the backend's first
    data-parallel dimension, and a dimension the backend does not declare is refused, naming both."""
    if parallelism is None:
        parallelism = ParallelismConfig.from_environment()
    if parallelism is None:
        return None
    supported = info.capabilities.mesh_dimensions
    data_parallel = [name for name in supported or () if name in DATA_PARALLEL_DIMENSIONS]
    parallelism.fill_world(environment_world_size(), data_parallel[0] if data_parallel else "dp_replicate")
    if supported is not None:
        parallelism.check_dimensions(backend, supported)
    warn_unused_handlers(parallelism)
    return parallelism


def detect_device(stack: PluginStack, cpu: bool, local_rank: int) -> torch.device:
    """This process's device: ``DRIVETRAIN_TORCH_DEVICE`` when set, else the device plugins' (then the
    backend's) ``detect_device``. NUMA affinity is set first when ``drivetrain launch --enable_cpu_affinity``
    asked for it, so that the device's memory is allocated near the cores."""
    if sources.env_flag("DRIVETRAIN_CPU_AFFINITY", "ACCELERATE_CPU_AFFINITY"):
        from drivetrain.affinity import set_numa_affinity

        set_numa_affinity(local_rank)
    device = _device_override() or stack.call("detect_device", local_process_index=local_rank, cpu=cpu)
    return torch.device(device)


def backend_for_device(
    manager: PluginRegistry, selection: sources.Setting, device_type: str
) -> sources.Setting:
    """The backend that runs ``device_type`` when none was asked for: the automatic choice if it declares the
    device, else a backend that asks for it (``PluginInfo.select_for_devices``, an XLA device's backend)."""
    if device_type in manager.info(selection.value).capabilities.devices:
        return selection
    backend = manager.backend_for_device(device_type)
    if backend is None:
        return selection
    return sources.Setting(backend, f"automatic (device {device_type})")


def join_process_group(
    stack: PluginStack,
    backend: str,
    device: torch.device,
    init_kwargs: Mapping[str, Any],
    parallelism: ParallelismConfig | None,
    backend_config: Any,
) -> DistributedEnvironment:
    """The backend's ``setup_process_group``: where this process stands among the others."""
    environment = stack.call(
        "setup_process_group",
        device=device,
        init_kwargs=dict(init_kwargs),
        parallelism=parallelism,
        backend_config=backend_config,
    )
    if environment is None:
        raise PluginError(f"backend {backend!r} returned nothing from setup_process_group")
    return environment


def attach_mesh(parallelism: ParallelismConfig | None, environment: DistributedEnvironment) -> None:
    """Check the parallel sizes against the processes the backend reports, and keep its mesh on the config."""
    if parallelism is not None:
        parallelism.check_world_size(environment.num_processes)
        parallelism.device_mesh = environment.device_mesh


def report(backend: str, source: str, environment: DistributedEnvironment) -> None:
    """Tell ``drivetrain launch`` which backend the script used (its banner could only guess before the
    script ran: process 0 writes it to the file the launcher named), and install the failure report that
    names the rank a run failed on."""
    report_backend(backend, source, environment)
    from drivetrain import failure_report

    failure_report.install(environment.process_index, environment.num_processes)


def report_backend(backend: str, source: str, environment: DistributedEnvironment) -> None:
    """Process 0 tells ``drivetrain launch`` which backend it runs and why, on the launcher's channel (again
    when a named backend takes over from the automatic one). A courtesy: without a launcher, nothing."""
    if environment.process_index == 0:
        from drivetrain import launch_channel

        launch_channel.send({"kind": "backend", "name": backend, "source": source})


def _device_override() -> torch.device | None:
    for variable in DEVICE_OVERRIDE_ENV:
        value = os.environ.get(variable, "").strip()
        if not value:
            continue
        try:
            device = torch.device(value)
        except RuntimeError:
            raise ConfigurationError(
                f"{variable}={value!r} is not a torch device; use a name like 'cpu', 'cuda' or 'cuda:1'"
            ) from None
        set_device = getattr(getattr(torch, device.type, None), "set_device", None)
        if device.index is not None and set_device is not None:
            set_device(device)
        return device
    return None
