"""What a plugin declares about itself (``PLUGIN_INFO``) and what it registers besides hooks (``ExtensionRegistry``).

Both are read by the kernel instead of tables of backend names: the config file maps Accelerate's
``distributed_type`` and config sections through ``PluginInfo``, the launcher finds a plugin's flags and
config keys in the registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from drivetrain.contract.version import CONTRACT_VERSION
from drivetrain.errors import PluginError

ENTRY_POINT_GROUP = "drivetrain.plugins"
#: Device runtime plugins list themselves here too (same name, same object): every process asks them for its
#: device, so the kernel imports them, and only them, without being told to.
DEVICE_ENTRY_POINT_GROUP = "drivetrain.devices"
#: Public names that plugins add to ``drivetrain`` / ``drivetrain.utils`` (``DeepSpeedPlugin = "mod:obj"``).
EXPORTS_GROUP = "drivetrain.exports"
#: The kernel's own backend: one process; every first-result hook falls back to it.
REFERENCE_BACKEND = "local"
#: Plugin kinds in composition order: a device runtime converts first, the distribution backend wraps last.
PLUGIN_KINDS = ("device", "precision", "feature", "backend", "extension")
KIND_ORDER = {kind: position for position, kind in enumerate(PLUGIN_KINDS)}
#: PluginInfo fields of contract 1.0 that 1.1 removed, with what to do instead.
REMOVED_FIELDS = {
    "config_class": "delete it: the backend configuration object names its backend in `backend_name`",
}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend promises; the conformance suite reports properties outside these as not applicable."""

    multi_process: bool = False
    #: Each process holds only part of the model or optimizer state (FSDP, DeepSpeed ZeRO, a
    #: ZeroRedundancyOptimizer): the conformance suite checks the declaration against what the processes hold.
    sharded_state: bool = False
    precisions: tuple[str, ...] = ("no",)
    devices: tuple[str, ...] = ("cpu",)
    #: Between synchronisations each process's own gradients are in ``param.grad`` (DDP). False for
    #: backends that keep them elsewhere (FSDP2 accumulates unsharded gradients internally; DeepSpeed's
    #: engine reduces them inside backward), where ``no_sync`` cannot be observed through ``param.grad``.
    local_gradients: bool = True
    #: Weights themselves are kept in the 16-bit compute precision (DeepSpeed bf16), so training drifts
    #: further from fp32 weights than autocast does; the conformance suite uses its looser tolerance.
    low_precision_weights: bool = False
    #: The ``ParallelismConfig`` dimensions the backend can split (``("dp_replicate", "dp_shard", "tp")``), the
    #: data-parallel one a ``ParallelismConfig()`` of all ones fills first. The kernel refuses a run that
    #: enables another dimension, with an error naming it and the backend. ``None`` (contract 1.1 plugins):
    #: not declared, the backend checks what it receives in ``setup_process_group`` itself.
    mesh_dimensions: tuple[str, ...] | None = None
    #: A checkpoint written by ``save_state`` loads with the reference backend ``local`` (one process), and a
    #: ``local`` checkpoint loads here: the files hold the whole model and optimizer state in the reference
    #: format. The conformance suite resumes backend -> local and local -> backend (contract 1.1).
    portable_checkpoints: bool = False
    #: ``None``: gradients are clipped where a script calls ``accelerator.clip_grad_norm_`` (the
    #: ``clip_grad_norm`` hook), and nowhere else. A name: the backend's own optimizer step clips by this
    #: setting of its configuration, ``0`` meaning not at all (``"gradient_clipping"``: DeepSpeed, where
    #: ``clip_grad_norm_`` then only returns the norm, and Megatron, which clips at 1.0 unless told otherwise,
    #: as in Accelerate). The conformance suite sets it, through the launcher's backend settings, to the max
    #: norm where its recipe clips and to 0 everywhere else (contract 1.2).
    clipping_setting: str | None = None
    #: Plain data parallelism: every prepared model is a torch ``Joinable`` (``DistributedDataParallel``) whose
    #: collectives torch's ``Join`` can shadow, so ``accelerator.join_uneven_inputs`` runs its block under
    #: ``Join`` when this backend is in charge of the run's distributed type. False: it warns and runs the block
    #: without it (sharded or compiled engines run collectives ``Join`` does not know). The conformance suite
    #: trains uneven inputs under it and checks that the processes end with the same weights (contract 1.3).
    joinable: bool = False


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """What a plugin module declares about itself as ``PLUGIN_INFO = PluginInfo(...)``.

    Reading it imports the plugin module but never the plugin's third-party library.
    """

    kind: str = "extension"
    #: Contract version the plugin was written for (see ``hookspecs.CONTRACT_VERSION``).
    contract: str = CONTRACT_VERSION
    #: Importable names of third-party libraries the plugin needs (``("deepspeed",)``). ``drivetrain
    #: plugins`` reports whether each is installed without importing it.
    requires: tuple[str, ...] = ()
    #: Libraries that enable parts of the plugin, importable name -> what it enables
    #: (``{"torchao": "the torchao fp8 backend"}``); listed with whether each is installed.
    optional_requires: dict[str, str] = dataclasses.field(default_factory=dict)
    description: str = ""
    capabilities: Capabilities = Capabilities()
    #: For backends: Accelerate's ``DistributedType`` name this backend answers (``"FSDP"``). A config file
    #: written by Accelerate (``distributed_type: FSDP``) selects the backend that declares it.
    distributed_type: str | None = None
    #: For backends: the section of Accelerate's config file that holds this backend's settings
    #: (``"fsdp_config"``); it becomes the run's ``backend_config``.
    config_section: str | None = None
    #: For backends: Accelerate's ``launch`` flag that selects this backend (``"use_fsdp"``).
    launch_flag: str | None = None
    #: For precision plugins: the ``mixed_precision`` values they provide (``("fp8",)``).
    precisions: tuple[str, ...] = ()
    #: For backends: chosen automatically when a script runs in several processes and nothing else is asked.
    select_for_multiprocess: bool = False
    #: For backends: chosen automatically when no backend was asked for and the device ``detect_device``
    #: returned is of one of these types (``("xla",)``): a device runtime that needs its own backend.
    select_for_devices: tuple[str, ...] = ()
    #: For backends that place parameters themselves (DeepSpeed, FSDP meta-device loading).
    places_model: bool = False
    #: For backends whose engine handles mixed precision and loss scaling itself (DeepSpeed): no GradScaler.
    manages_precision: bool = False
    #: For backends: the ``ParallelismConfig.sp_backend`` value that names the backend's own sequence
    #: parallelism (``"deepspeed"``: Accelerate's ALST/Ulysses); ``ParallelismConfig`` accepts the values the
    #: installed backends declare, besides Accelerate's default (contract 1.3).
    sp_backend: str | None = None
    #: For backends: the gradient scaler Accelerate's ``get_grad_scaler(distributed_type=...)`` builds for this
    #: backend's ``distributed_type``, as ``"module:attribute"`` (``"torch.distributed.fsdp.sharded_grad_scaler:
    #: ShardedGradScaler"``, as Accelerate gives for FSDP). None: torch's ``GradScaler`` on the machine's
    #: accelerator (contract 1.3).
    grad_scaler: str | None = None
    #: For precision plugins: the torch dtype, by name (``"bfloat16"``), in which autocast computes under the
    #: precisions the plugin provides: what Accelerate's ``get_mixed_precision_context_manager`` gives for them
    #: (bfloat16 for fp8). None: torch's default autocast dtype of the device (contract 1.3).
    autocast_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in PLUGIN_KINDS:
            raise ValueError(
                f"PluginInfo.kind={self.kind!r} is not valid; choose one of: {', '.join(PLUGIN_KINDS)}"
            )


@dataclasses.dataclass
class DiscoveredPlugin:
    """An entry point seen in the metadata, possibly not yet imported."""

    name: str
    value: str
    distribution: str
    version: str
    entry_point: Any = dataclasses.field(default=None, repr=False)
    module: Any = dataclasses.field(default=None, repr=False)
    #: Why the plugin could not be loaded (it is skipped and listed as broken), or None.
    error: str | None = None

    @property
    def loaded(self) -> bool:
        return self.module is not None

    @property
    def info(self) -> PluginInfo:
        return getattr(self.module, "PLUGIN_INFO", None) or PluginInfo()


@dataclasses.dataclass
class ExtensionRegistry:
    """What plugins register through the ``register_extensions`` hook. Keys record the plugin's name."""

    trackers: dict[str, tuple[str, type]] = dataclasses.field(default_factory=dict)
    commands: dict[str, tuple[str, Callable, Callable, str]] = dataclasses.field(default_factory=dict)
    launch_options: list[tuple[str, Callable]] = dataclasses.field(default_factory=list)
    launchers: dict[str, tuple[str, Callable]] = dataclasses.field(default_factory=dict)
    #: name -> (plugin, getter(state), also on the Accelerator)
    state_attributes: dict[str, tuple[str, Callable, bool]] = dataclasses.field(default_factory=dict)
    #: config-file key -> (plugin, check(value) -> normalised value)
    config_keys: dict[str, tuple[str, Callable[[Any], Any]]] = dataclasses.field(default_factory=dict)
    current_plugin: str = ""

    def add_tracker(self, name: str, tracker_class: type) -> None:
        """Make ``Accelerator(log_with=name)`` build ``tracker_class``."""
        self._claim(self.trackers, name, "tracker")
        self.trackers[name] = (self.current_plugin, tracker_class)

    def add_command(self, name: str, register_parser: Callable, run: Callable, help: str = "") -> None:
        """Add ``drivetrain <name>``. ``register_parser(parser)`` adds arguments; ``run(args)`` returns an
        exit code."""
        self._claim(self.commands, name, "command")
        self.commands[name] = (self.current_plugin, register_parser, run, help)

    def add_launch_options(self, add_arguments: Callable) -> None:
        """``add_arguments(parser)`` adds options to ``drivetrain launch``, shown under the plugin's name.
        The values the user sets reach the processes: ``plugin_api.settings.plugin_options(name)`` (a
        backend's also merge into ``plugin_api.settings.backend_settings(name)``)."""
        self.launch_options.append((self.current_plugin, add_arguments))

    def add_launcher(self, backend: str, launcher: Callable) -> None:
        """``launcher(args, script_argv) -> int`` replaces torch's elastic launcher for ``--backend backend``
        when it returns an exit code (return ``None`` to fall back to the elastic launcher)."""
        self._claim(self.launchers, backend, "launcher")
        self.launchers[backend] = (self.current_plugin, launcher)

    def add_state_attribute(self, name: str, getter: Callable, on_accelerator: bool = False) -> None:
        """Make ``AcceleratorState().<name>`` (and ``accelerator.<name>`` when ``on_accelerator``) return
        ``getter(state)``: the Accelerate spellings that belong to one backend (its active configuration, a
        method selecting one). Consulted only for names no kernel attribute has; the getter answers whatever
        backend runs (e.g. ``None`` when it is not its own, as Accelerate does)."""
        if name.startswith("_"):
            raise PluginError(
                f"plugin {self.current_plugin!r}: state attribute {name!r} must not start with '_'"
            )
        self._claim(self.state_attributes, name, "state attribute")
        self.state_attributes[name] = (self.current_plugin, getter, on_accelerator)

    def add_config_keys(self, keys: dict[str, Callable[[Any], Any]]) -> None:
        """Claim top-level keys of the config file (``{"fp8_config": check}``). ``check(value)`` returns the
        normalised value, or None for a value that states no choice (one Accelerate writes into every config
        file, such as ``tpu_use_sudo: false``: it is left out), or raises ValueError saying what is valid; the
        launcher hands the values to the processes with the plugin's launch options
        (``plugin_api.settings.plugin_options(name)``)."""
        for key, check in keys.items():
            self._claim(self.config_keys, key, "config key")
            self.config_keys[key] = (self.current_plugin, check)

    def _claim(self, table: dict, name: str, what: str) -> None:
        if name in table and table[name][0] != self.current_plugin:
            raise PluginError(
                f"plugin {self.current_plugin!r} registers {what} {name!r}, already registered by plugin "
                f"{table[name][0]!r}; uninstall one of them or restrict loading with DRIVETRAIN_LOAD_PLUGINS"
            )

    def forget(self, plugin: str) -> None:
        """Drop everything ``plugin`` registered (when it is unregistered)."""
        for table in (self.trackers, self.commands, self.launchers, self.state_attributes, self.config_keys):
            for key in [key for key, value in table.items() if value[0] == plugin]:
                del table[key]
        self.launch_options[:] = [entry for entry in self.launch_options if entry[0] != plugin]


class PluginHooks:
    """What is registered with pluggy for one plugin: its hook functions (pluggy compares plugins by
    identity and needs them hashable, which a plugin object registered in code need not be)."""

    def __init__(self, plugin: str, hooks: dict[str, Callable[..., Any]]) -> None:
        self.plugin = plugin
        for name, function in hooks.items():
            setattr(self, name, function)

    def __repr__(self) -> str:
        return f"<hooks of drivetrain plugin {self.plugin!r}>"
