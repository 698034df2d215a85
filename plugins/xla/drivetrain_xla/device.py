"""The xla device plugin: says when a process computes on an XLA device, so the xla backend takes over.

Listed in the ``drivetrain.devices`` entry-point group, so every process imports it (and not torch_xla) to
ask for its device. It answers when the environment asks for an XLA runtime (``PJRT_DEVICE``, or what a TPU
VM sets) and torch_xla can work with this torch; the xla backend declares ``select_for_devices=("xla",)``,
so the kernel then runs it instead of ``local``. With the backend named explicitly (``backend="xla"``,
``drivetrain launch --tpu``) the backend answers ``detect_device`` itself.
"""

from __future__ import annotations

import warnings

import torch

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, ConfigurationError, PluginAccelerator, PluginInfo
from drivetrain_xla import runtime

PLUGIN_INFO = PluginInfo(
    kind="device",
    description="XLA devices (TPU, torch_xla's CPU device): chosen when PJRT_DEVICE asks for one",
    optional_requires={"torch_xla": "XLA devices (torch_xla with the torch release of the same number)"},
    capabilities=Capabilities(multi_process=True, precisions=("no", "bf16"), devices=("xla",)),
)

_warned: set[str] = set()


@hookimpl
def detect_device(cpu: bool) -> torch.device | None:
    requested = runtime.device_requested()
    if requested is None:
        return None
    problem = runtime.torch_xla_problem()
    if problem is not None:
        if problem not in _warned and not cpu:
            _warned.add(problem)
            warnings.warn(
                f"drivetrain-xla: {requested} asks for an XLA device, but {problem}; computing without XLA",
                stacklevel=2,
            )
        return None
    # Start the XLA runtime now, even for a cpu=True run of this process: torch's autograd engine sizes its
    # per-device queues at the first backward pass of a process, and an XLA backward after a CPU one that ran
    # before the runtime started fails (INTERNAL ASSERT in engine.cpp). SPMD can still be switched on later.
    runtime.start()
    if cpu:
        return None
    return torch.device("xla", 0)


@hookimpl
def wrap_model(accelerator: PluginAccelerator) -> None:
    if accelerator.device.type == "xla" and accelerator.backend_plugin != "xla":
        raise ConfigurationError(
            f"the XLA device trains only with backend 'xla' (this run uses backend {accelerator.backend_plugin!r}): "
            "drop backend=/--backend (xla is chosen for the XLA device), or unset PJRT_DEVICE to train "
            f"with {accelerator.backend_plugin!r} without XLA"
        )
