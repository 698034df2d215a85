"""The plugin contract: every hook a drivetrain plugin can implement.

Read this file top to bottom to learn how to write a backend. A plugin is a module (or object) that defines
functions decorated with :data:`hookimpl` whose names and argument names match the specs below. A plugin
implements only the hooks where it differs from the reference backend ``local``; the kernel falls back to
``local`` for the rest.

How the kernel calls a hook is declared here, by its spec, and nowhere else (``HOOK_STYLES`` reads it):

* **first result** (``@hookspec(firstresult=True)``) — the active plugins are asked in composition order
  (device, precision and feature plugins, then the distribution backend, then ``local``) and the first value
  that is not ``None`` wins. Returning ``None`` is the documented way to reuse the reference behaviour.
* **chain** (``@chain_hookspec("model")``) — every active plugin that implements the hook is called in
  composition order; each receives, in the named argument, the value returned by the one before (``None``
  means "unchanged").
* **broadcast** (plain ``@hookspec``) — every plugin is called; results are ignored.

The calls go through pluggy's hook callers (``drivetrain.contract.calling``), so pluggy's monitoring serves
``DRIVETRAIN_TRACE_PLUGINS=1``.

Composition order (docs/architecture.md, "The order in which plugins wrap a model"): device runtime plugins
(``kind="device"``: xla, ipex, mps), then precision plugins (``kind="precision"``: fp8), then other features
(``kind="feature"``: offload), then the distribution backend (``kind="backend"``: local, ddp, fsdp, deepspeed,
megatron). So an fp8 conversion happens before DDP wraps the converted model.

Every hook's argument names are part of the public contract: an implementation may take any subset of them,
in any order, and is rejected at registration if it names an argument that is not here. Everything else a
plugin uses from the kernel comes from :mod:`drivetrain.plugin_api`.

Contract 1.1 (see docs/plugins/versioning.md) added the arguments ``parallelism`` and ``backend_config``
(setup_process_group),
``options`` (shard_dataloader), ``weights`` and ``save_kwargs`` (save_state), ``load_kwargs`` and ``verified``
(load_state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

from drivetrain.contract.version import CONTRACT_VERSION, PROJECT_NAME

if TYPE_CHECKING:  # pragma: no cover - imports for annotations only
    import contextlib

    import torch

    from drivetrain.config.parallelism import ParallelismConfig
    from drivetrain.contract.arguments import PluginAccelerator as Accelerator
    from drivetrain.contract.arguments import ShardingOptions
    from drivetrain.contract.environment import DistributedEnvironment
    from drivetrain.contract.info import ExtensionRegistry

__all__ = ["CONTRACT_VERSION", "HOOK_STYLES", "PROJECT_NAME", "chain_hookspec", "hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
_CHAIN_MARK = f"{PROJECT_NAME}_chain"


def chain_hookspec(value_argument: str) -> Callable[[Callable], Callable]:
    """Declare a **chain** hook: each implementation receives the previous one's result in
    ``value_argument``."""

    def mark(function: Callable) -> Callable:
        setattr(function, _CHAIN_MARK, value_argument)
        return hookspec(function)

    return mark


# ---------------------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------------------


@hookspec
def register_extensions(registry: ExtensionRegistry) -> None:
    """Register what a plugin adds besides the training hooks: experiment trackers, CLI subcommands,
    launch options and launchers.

    Called once for every plugin, right after it is loaded (**broadcast**). Only light, import-free work
    belongs here: register classes or callables, import their heavy libraries inside them.

    :param registry: an :class:`~drivetrain.contract.info.ExtensionRegistry`. Call ``registry.add_tracker(name,
        cls)``, ``registry.add_command(name, register_parser, run, help)``,
        ``registry.add_launch_options(add_arguments)`` or ``registry.add_launcher(backend, launcher)``.
    """


# ---------------------------------------------------------------------------------------------------------
# The process: device and process group
# ---------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def detect_device(local_process_index: int, cpu: bool) -> torch.device | None:
    """Pick the device this process computes on.

    Called once per process, when the process state is first built (**first result**). A device runtime
    plugin (xla, mps, xpu) returns its device when its hardware is present; ``local`` returns
    ``cuda:<local_process_index>`` when CUDA is available and ``cpu`` is false, else ``cpu``.

    :param local_process_index: rank of this process on its machine.
    :param cpu: the user forced CPU (``Accelerator(cpu=True)`` or ``--cpu``).
    :return: a :class:`torch.device`, or ``None`` to let the next plugin decide.
    """


@hookspec(firstresult=True)
def setup_process_group(
    device: torch.device,
    init_kwargs: dict[str, Any],
    parallelism: ParallelismConfig | None,
    backend_config: Any,
) -> DistributedEnvironment | None:
    """Join (or create) the process group and describe the distributed environment.

    Called once per process, after :func:`detect_device`, by the selected distribution backend
    (**first result**). DDP reads the torchrun environment and calls ``torch.distributed.init_process_group``
    (gloo on CPU, nccl on CUDA); DeepSpeed calls ``deepspeed.init_distributed``; XLA returns its own
    collectives; Megatron builds its tensor/pipeline grid and reports its data-parallel group.

    :param device: the device returned by :func:`detect_device`.
    :param init_kwargs: non-default fields of ``InitProcessGroupKwargs`` (``backend``, ``timeout``, ...).
    :param parallelism: the run's :class:`~drivetrain.config.parallelism.ParallelismConfig` (sizes of the
        data-parallel, tensor and context dimensions), or ``None``. A backend that supports several
        dimensions builds the mesh (``parallelism.build_device_mesh(device.type)``) and returns it in the
        environment with the data-parallel coordinates (and ``context_parallel`` for a ``cp`` dimension).
        The kernel has already refused dimensions outside ``Capabilities.mesh_dimensions``; a backend that
        declares none raises a :class:`~drivetrain.errors.ConfigurationError` naming what it cannot do.
    :param backend_config: the backend configuration object the script passed (``Accelerator(backend_config=
        ...)`` or an alias such as ``fsdp_plugin=``, ``megatron_lm_plugin=``), or ``None``: settings that must act
        before the process groups exist or the device is first used (Megatron's tensor/pipeline degrees, XLA's
        SPMD mode) are read here.
    :return: a :class:`~drivetrain.contract.environment.DistributedEnvironment` (ranks, world size,
        distributed type, data-parallel coordinates, device mesh, and the
        :class:`~drivetrain.contract.environment.Collectives` the kernel uses for gather/broadcast/reduce).
    """


# ---------------------------------------------------------------------------------------------------------
# Preparing objects
# ---------------------------------------------------------------------------------------------------------


@chain_hookspec("model")
def wrap_model(
    model: torch.nn.Module, accelerator: Accelerator, evaluation_mode: bool
) -> torch.nn.Module | None:
    """Convert or wrap a model for training.

    Called by ``Accelerator.prepare``/``prepare_model`` for every model (**chain**, in composition order).
    Before the chain the kernel moves the model to ``accelerator.device`` (when device placement is on and
    the backend does not declare ``places_model``). FP8 and IPEX convert layers here; DDP wraps in
    ``DistributedDataParallel``; FSDP applies its wrap policy and ``fully_shard``; DeepSpeed builds its
    engine (with the optimizer given to ``prepare`` in the same call, see
    ``accelerator.prepared.pending_optimizers``).

    :param model: the model as returned by the previous plugin in the chain.
    :param accelerator: the :class:`~drivetrain.Accelerator` preparing it.
    :param evaluation_mode: true for ``prepare_model(model, evaluation_mode=True)``: prepare for
        inference only (no gradient synchronisation wrapper).
    :return: the model to use from now on, or ``None`` to leave it unchanged.
    """


@chain_hookspec("optimizer")
def wrap_optimizer(
    optimizer: torch.optim.Optimizer, accelerator: Accelerator
) -> torch.optim.Optimizer | None:
    """Convert or replace an optimizer.

    Called by ``Accelerator.prepare`` for every optimizer, after all models of the same ``prepare`` call
    were wrapped (**chain**). FSDP re-binds the optimizer to the sharded parameters; DeepSpeed returns the
    engine's optimizer. The kernel then wraps the result in ``AcceleratedOptimizer``. When the result is
    another optimizer object than the one given, the kernel rebinds LR schedulers prepared with the user's
    optimizer to it (``Accelerator.prepare_scheduler``), so a backend need not.

    :param optimizer: the optimizer as returned by the previous plugin.
    :param accelerator: the :class:`~drivetrain.Accelerator` preparing it.
    :return: the optimizer to use, or ``None`` to leave it unchanged.
    """


@hookspec(firstresult=True)
def shard_dataloader(
    dataloader: Any, accelerator: Accelerator, device_placement: bool, options: ShardingOptions
) -> Any | None:
    """Make a data loader yield this process's share of every batch.

    Called by ``Accelerator.prepare`` for every ``torch.utils.data.DataLoader`` (**first result**). The
    reference implementation (``local``) covers one and many processes: batch-sampler sharding,
    ``split_batches``, ``even_batches``, ``dispatch_batches``, iterable datasets, seedable samplers and
    stateful loaders: ``prepare_data_loader(dataloader, **options.to_kwargs())``. XLA returns its parallel
    loader; a backend that shards data over a data-parallel group only (tensor parallelism) passes
    ``dataclasses.replace(options, num_processes=dp_size, process_index=dp_rank)``.

    :param dataloader: the user's data loader.
    :param accelerator: the :class:`~drivetrain.Accelerator`.
    :param device_placement: move batches to ``accelerator.device`` (also ``options.put_on_device``).
    :param options: a :class:`~drivetrain.contract.info.ShardingOptions`: this process's share (by default
        the data-parallel size and rank of the environment) and the ``dataloader_config`` settings.
    :return: the prepared data loader.
    """


# ---------------------------------------------------------------------------------------------------------
# The training step
# ---------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def autocast(
    accelerator: Accelerator, autocast_kwargs: dict[str, Any]
) -> contextlib.AbstractContextManager | None:
    """Return the context manager under which forward passes run in the requested precision.

    Called by ``Accelerator.autocast()`` and around prepared models' forward (**first result**). ``local``
    returns ``torch.autocast`` for bf16/fp16 and a null context for fp32; FP8 returns its recipe context.

    :param accelerator: the :class:`~drivetrain.Accelerator` (``accelerator.mixed_precision``).
    :param autocast_kwargs: non-default fields of ``AutocastKwargs`` (``enabled``, ``cache_enabled``).
    :return: a context manager.
    """


@hookspec(firstresult=True)
def backward(loss: torch.Tensor, accelerator: Accelerator, backward_kwargs: dict[str, Any]) -> bool | None:
    """Run the backward pass for ``loss``.

    Called by ``Accelerator.backward`` after the loss was divided by the accumulation steps
    (**first result**). ``local`` scales the loss with the GradScaler when fp16 is on and calls
    ``loss.backward(**backward_kwargs)``; DeepSpeed calls ``engine.backward``.

    :param loss: the (already accumulation-scaled) loss.
    :param accelerator: the :class:`~drivetrain.Accelerator`.
    :param backward_kwargs: keyword arguments for ``torch.Tensor.backward``.
    :return: ``True`` when the backward pass was run.
    """


@hookspec(firstresult=True)
def clip_grad_norm(
    parameters: list[torch.nn.Parameter], max_norm: float, norm_type: float, accelerator: Accelerator
) -> torch.Tensor | None:
    """Clip gradients by their global norm and return that norm (before clipping).

    Called by ``Accelerator.clip_grad_norm_`` after gradients were unscaled (**first result**). FSDP
    computes the norm across shards; DeepSpeed returns the norm its engine computed.

    :param parameters: the parameters whose gradients are clipped.
    :param max_norm: the largest allowed norm.
    :param norm_type: the p of the p-norm (``inf`` for the max norm).
    :param accelerator: the :class:`~drivetrain.Accelerator`.
    :return: the total norm as a tensor.
    """


# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def save_state(
    output_dir: str,
    accelerator: Accelerator,
    models: list[torch.nn.Module],
    weights: list[dict[str, torch.Tensor]],
    optimizers: list[Any],
    schedulers: list[Any],
    safe_serialization: bool,
    save_kwargs: dict[str, Any],
) -> bool | None:
    """Write models, optimizers and schedulers of a checkpoint into ``output_dir``.

    Called by ``Accelerator.save_state`` on every process (**first result**), inside the temporary folder
    that the kernel later seals with a manifest and renames into place; RNG states, data loader positions,
    the GradScaler and registered objects are written by the kernel beside it. ``local`` writes
    ``model.safetensors`` / ``optimizer.bin`` / ``scheduler.bin`` (index suffixes for the 2nd, 3rd ...);
    FSDP writes sharded DCP state; DeepSpeed calls ``engine.save_checkpoint``.

    :param output_dir: the (temporary) checkpoint folder, already created.
    :param accelerator: the :class:`~drivetrain.Accelerator`.
    :param models: prepared models, in registration order (those the save_state pre-hooks kept).
    :param weights: the state dicts of ``models``' user modules as the save_state pre-hooks left them
        (a replicated backend writes these; a sharded one saves its shards itself).
    :param optimizers: prepared optimizers (``AcceleratedOptimizer``), in order.
    :param schedulers: prepared schedulers (``AcceleratedScheduler``), in order.
    :param safe_serialization: write weights as safetensors.
    :param save_kwargs: the extra keyword arguments given to ``Accelerator.save_state`` (DeepSpeed passes
        them to ``engine.save_checkpoint``).
    :return: ``True`` when written.
    """


@hookspec(firstresult=True)
def load_state(
    input_dir: str,
    accelerator: Accelerator,
    models: list[torch.nn.Module],
    optimizers: list[Any],
    schedulers: list[Any],
    map_location: Any,
    load_kwargs: dict[str, Any],
    verified: Callable[[], None],
) -> bool | None:
    """Restore models, optimizers and schedulers from a checkpoint folder written by :func:`save_state`.

    Called by ``Accelerator.load_state`` on every process (**first result**). The kernel checks every file
    of the folder against its manifest. An implementation that takes ``verified`` is called while that
    check runs: it reads what it needs, calls ``verified()`` (collective: every process calls it once), and
    applies nothing before it returned. An implementation without ``verified`` is called after the check
    passed.

    :param input_dir: the checkpoint folder.
    :param accelerator: the :class:`~drivetrain.Accelerator`.
    :param models: prepared models to restore into.
    :param optimizers: prepared optimizers to restore into.
    :param schedulers: prepared schedulers to restore into.
    :param map_location: where tensors are loaded (``"cpu"``, ``"on_device"`` or a ``torch.device``).
    :param load_kwargs: keyword arguments for ``torch.load`` given to ``Accelerator.load_state``
        (``{"weights_only": False}`` is the user's explicit opt-out of safe unpickling).
    :param verified: blocks until the manifest check passed on every process; raises
        :class:`~drivetrain.errors.CheckpointError` when it failed anywhere.
    :return: ``True`` when restored.
    """


# ---------------------------------------------------------------------------------------------------------
# Big-model inference
# ---------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def dispatch_module(
    model: torch.nn.Module,
    device_map: dict[str, Any],
    main_device: Any,
    offload_dir: str | None,
    state_dict: dict[str, Any] | None,
    options: dict[str, Any],
) -> torch.nn.Module | None:
    """Place a model's modules as a device map says, including weights offloaded to ``"cpu"`` or
    ``"disk"``, so that forward moves each block's weights where it runs.

    Called by ``dispatch_model``/``load_checkpoint_and_dispatch`` when the device map offloads something or
    spans several devices (**first result**). Provided by the offload plugin (``drivetrain-offload``); the
    kernel alone handles maps that put everything on one device.

    :param model: the model, possibly with weights on the meta device.
    :param device_map: module name -> device (``int``, ``"cpu"``, ``"disk"``, ``torch.device``).
    :param main_device: the device that receives inputs and returns outputs.
    :param offload_dir: folder of offloaded weights (``"disk"`` entries).
    :param state_dict: weights of ``"cpu"``-offloaded modules, by parameter name, when already loaded.
    :param options: the other options of the ``dispatch_model`` call: ``offload_buffers``, ``skip_keys``,
        ``preload_module_classes``, ``offload_index``, ``prefetch``, ``force_hooks``.
    :return: the dispatched model.
    """


def _styles() -> dict[str, tuple[str, str | None]]:
    """Hook name -> ("first" | "chain" | "broadcast", the chained argument or None), read from the specs."""
    styles: dict[str, tuple[str, str | None]] = {}
    for name, function in list(globals().items()):
        options = getattr(function, f"{PROJECT_NAME}_spec", None)
        if options is None or not callable(function):
            continue
        chained = getattr(function, _CHAIN_MARK, None)
        if chained is not None:
            styles[name] = ("chain", chained)
        elif options.get("firstresult"):
            styles[name] = ("first", None)
        else:
            styles[name] = ("broadcast", None)
    return styles


#: How each hook is called, from its spec: ``{"wrap_model": ("chain", "model"), "backward": ("first", None)}``.
HOOK_STYLES: dict[str, tuple[str, str | None]] = _styles()
