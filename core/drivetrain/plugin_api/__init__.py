"""Everything a drivetrain plugin may import from the kernel: contract 1.3.

A plugin package imports from the kernel only this package (``from drivetrain import hookimpl`` works too).
In-tree plugins follow the same rule as third parties, and ``tests/contract/test_architecture.py`` enforces it: when a
plugin needs something the kernel has, it is exported here on purpose, documented in docs/plugins/api.md
(generated from this package), and covered by the contract's version. Objects hooks receive are documented
attribute by attribute there; a plugin never reads an underscore attribute of a kernel object.

This module holds the names nearly every plugin needs: the contract, what a plugin declares, what hooks
receive, joining and leaving processes, and the errors. The other helpers live in namespaces, each a module
imported only when a plugin imports it (so that importing a plugin module stays cheap):

- :mod:`drivetrain.plugin_api.settings`   what the launcher and the config file hand a plugin, and parsers
- :mod:`drivetrain.plugin_api.state`      the process-wide state objects (Accelerate's), RNG types
- :mod:`drivetrain.plugin_api.training`   the training step: the reference backward, optimizers, schedulers
- :mod:`drivetrain.plugin_api.data`       data loaders and moving batches to a device
- :mod:`drivetrain.plugin_api.checkpoint` the reference checkpoint files, and safe readers
- :mod:`drivetrain.plugin_api.big_model`  big-model loading, offloading and quantization helpers
- :mod:`drivetrain.plugin_api.tracking`   experiment trackers
- :mod:`drivetrain.plugin_api.tooling`    for tools that inspect plugins (the conformance suite, listings)

Contract 1.1 exported all of them from here; those flat names still import, with a ``DeprecationWarning``
naming their namespace (docs/plugins/versioning.md). Type checkers see only the 1.2 names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain.config.enums import DistributedType, PrecisionType
from drivetrain.config.parallelism import ParallelismConfig
from drivetrain.contract.arguments import PluginAccelerator, PreparedObjects, ShardingOptions
from drivetrain.contract.environment import Collectives, DistributedEnvironment, environment_world_size
from drivetrain.contract.hookspecs import CONTRACT_VERSION, hookimpl
from drivetrain.contract.info import Capabilities, ExtensionRegistry, PluginInfo
from drivetrain.errors import CheckpointError, ConfigurationError, DrivetrainError, PluginError, UsageError
from drivetrain.launching.ports import free_port
from drivetrain.operations.process_group import (
    join_process_group,
    release_at_shutdown,
    shutdown_process_group,
    wrap_data_parallel,
)
from drivetrain.operations.torch_collectives import TorchCollectives
from drivetrain.plugin_api._moved import NAMESPACES, moved_name

__all__ = [
    # the contract
    "CONTRACT_VERSION",
    "hookimpl",
    # declarations
    "Capabilities",
    "ExtensionRegistry",
    "PluginInfo",
    # what hooks receive
    "PluginAccelerator",
    "PreparedObjects",
    "ShardingOptions",
    # processes
    "Collectives",
    "DistributedEnvironment",
    "DistributedType",
    "ParallelismConfig",
    "PrecisionType",
    "TorchCollectives",
    "environment_world_size",
    "free_port",
    "join_process_group",
    "release_at_shutdown",
    "shutdown_process_group",
    "wrap_data_parallel",
    # errors
    "CheckpointError",
    "ConfigurationError",
    "DrivetrainError",
    "PluginError",
    "UsageError",
]

if not TYPE_CHECKING:  # contract 1.1's flat names: found at run time, invisible to type checkers

    def __getattr__(name: str):
        return moved_name(name, globals())


def __dir__() -> list[str]:
    return sorted([*__all__, *NAMESPACES])
