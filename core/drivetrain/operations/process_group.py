"""Joining the torch process group the launcher describes, and leaving it so that every process exits 0.

For backends built on ``torch.distributed`` (exported by ``plugin_api``): ``join_process_group`` is a whole
``setup_process_group`` for data parallelism, ``wrap_data_parallel`` a whole ``wrap_model``,
``release_at_shutdown`` registers a ``DistributedDataParallel`` wrapper built otherwise, and
``shutdown_process_group`` (the environment's ``shutdown``) meets the other ranks, releases the registered
wrappers and destroys the group.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from drivetrain.config.enums import DistributedType
from drivetrain.contract.arguments import PluginAccelerator
from drivetrain.contract.environment import DistributedEnvironment

#: Seconds a process waits at exit for the other ranks before leaving the group alone.
EXIT_TIMEOUT_VARIABLE = "DRIVETRAIN_EXIT_TIMEOUT"

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)

#: The wrappers registered with :func:`release_at_shutdown`.
_wrapped_models: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def release_at_shutdown(model: ModuleT) -> ModuleT:
    """Register a ``DistributedDataParallel`` wrapper (or a subclass) this backend built, so that
    :func:`shutdown_process_group` releases it before destroying the process group; returns ``model``.

    Why: the wrapper's C++ reducer holds the process group. If it outlives ``destroy_process_group`` it is
    destroyed during interpreter teardown, after gloo's threads, and the process aborts ("terminate called
    without an active exception") although training finished. A released wrapper can no longer run a
    training step; its ``module`` (``accelerator.unwrap_model``) still works.
    """
    _wrapped_models.add(model)
    return model


def wrap_data_parallel(
    model: torch.nn.Module,
    accelerator: PluginAccelerator,
    evaluation_mode: bool = False,
    *,
    wrapper: Callable[..., torch.nn.parallel.DistributedDataParallel] | None = None,
    **wrapper_kwargs: Any,
) -> torch.nn.parallel.DistributedDataParallel | None:
    """A whole ``wrap_model`` for data parallelism: torch's ``DistributedDataParallel`` (or ``wrapper``, a
    subclass of it) around ``model``, registered with :func:`release_at_shutdown`. ``wrapper_kwargs`` go to the
    wrapper; on an accelerator with an index, ``device_ids`` and ``output_device`` default to
    ``accelerator.device``'s.

    Returns ``None`` (the model unchanged, as ``wrap_model`` means it) in evaluation mode, in a run of one
    process, for a model that is already a ``DistributedDataParallel``, and for one without a parameter that
    requires a gradient (a frozen teacher: nothing to synchronise, and DDP refuses it).
    """
    if evaluation_mode or accelerator.num_processes <= 1:
        return None
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return None
    if not any(parameter.requires_grad for parameter in model.parameters()):
        return None
    device = accelerator.device
    if device.type != "cpu" and device.index is not None:
        wrapper_kwargs.setdefault("device_ids", [device.index])
        wrapper_kwargs.setdefault("output_device", device.index)
    build = wrapper or torch.nn.parallel.DistributedDataParallel
    return release_at_shutdown(build(model, **wrapper_kwargs))


def _release_wrapped_models() -> None:
    """Drop what each registered wrapper holds of the process group: reducer, logger, grad and comm hooks."""
    for model in list(_wrapped_models):
        for handle in getattr(model, "_accum_grad_hooks", ()):
            handle.remove()
        for name in ("reducer", "logger"):
            if name in model.__dict__:
                model.__dict__[name] = None
        comm_hooks = getattr(model, "_comm_hooks", None)
        if isinstance(comm_hooks, list):
            comm_hooks.clear()
    _wrapped_models.clear()
    gc.collect()


def shutdown_process_group(barrier_timeout: datetime.timedelta | None = None) -> None:
    """Meet the other ranks, release the wrappers registered with :func:`release_at_shutdown`, destroy the
    default process group. Does nothing when there is no group, so it may be called twice.

    With ``barrier_timeout``, give up (and leave the group alone) when the other ranks do not arrive in time.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    # Ranks must meet before the group goes away, or gloo may abort a rank still sending.
    if barrier_timeout is None:
        dist.barrier()
    else:
        dist.barrier(async_op=True).wait(timeout=barrier_timeout)
    _release_wrapped_models()
    dist.destroy_process_group()


#: Set when this process dies of an uncaught exception: its peers will not come to the exit barrier.
_died_of_exception = False
_exit_handler_installed = False


def _note_uncaught_exception(previous_hook: Any) -> Any:
    def hook(*args: Any) -> None:
        global _died_of_exception
        _died_of_exception = True
        previous_hook(*args)

    return hook


def _shutdown_at_exit() -> None:
    """atexit: a script that never called ``end_training`` / ``destroy_process_group`` still exits 0.

    A rank that failed skips the barrier (its peers are not coming; the launcher stops them), and a rank
    whose peers do not arrive within ``DRIVETRAIN_EXIT_TIMEOUT`` seconds (default 60) gives up waiting.
    """
    if _died_of_exception:
        return
    try:
        timeout = datetime.timedelta(seconds=float(os.environ.get(EXIT_TIMEOUT_VARIABLE, "60")))
        shutdown_process_group(barrier_timeout=timeout)
    except Exception as exc:  # a peer that already left must not turn a finished run into a failure
        print(
            f"drivetrain: process group shutdown at exit failed: {type(exc).__name__}: {exc}", file=sys.stderr
        )


def _install_exit_handler() -> None:
    global _exit_handler_installed
    if _exit_handler_installed:
        return
    # Registered after init_process_group so that it runs before torch's own exit handlers.
    atexit.register(_shutdown_at_exit)
    sys.excepthook = _note_uncaught_exception(sys.excepthook)
    _exit_handler_installed = True


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"joining the process group needs the environment variable {name}, which torchrun / drivetrain "
            "launch sets; start the script with `drivetrain launch --num_processes N script.py`"
        )
    return value


def _store_for_this_attempt(world_size: int, rank: int, timeout: datetime.timedelta | None) -> Any:
    """The rendezvous store, under a prefix of its own for each restart of the group.

    The elastic launcher keeps its store across restarts (``--max_restarts``), so without a prefix the
    restarted ranks can read the addresses that the dead ranks published and fail to connect.
    """
    import torch.distributed as dist

    hosted_by_launcher = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not hosted_by_launcher and rank == 0,
        timeout=timeout or datetime.timedelta(minutes=5),
        wait_for_workers=False,
    )
    return dist.PrefixStore(f"drivetrain/attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)


def _default_torch_backend(device: torch.device) -> str:
    """torch's own choice of communication backend for ``device``'s type (nccl on CUDA), gloo where it has none."""
    import torch.distributed as dist

    return dist.Backend.default_device_backend_map.get(device.type, "gloo")


def _multi_process_type(device: torch.device) -> DistributedType:
    if device.type == "cuda":
        return DistributedType.MULTI_GPU
    return DistributedType.__members__.get(f"MULTI_{device.type.upper()}", DistributedType.MULTI_CPU)


def join_process_group(
    device: torch.device, init_kwargs: dict[str, Any], *, alone: bool = False
) -> DistributedEnvironment:
    """``setup_process_group`` for a backend on ``torch.distributed``: join the group that the launcher
    (``drivetrain launch``, torchrun) describes in ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/
    ``MASTER_PORT``, and describe it. Returns a ``DistributedEnvironment`` with ``TorchCollectives`` and
    :func:`shutdown_process_group` as ``shutdown``; ``dataclasses.replace`` it to report another distributed type or
    to add a mesh.

    ``init_kwargs`` are the hook's (the script's ``InitProcessGroupKwargs``): ``backend`` (default: nccl on
    CUDA, gloo on the CPU), ``timeout`` (a ``timedelta`` or seconds), ``init_method`` and the rest of
    ``init_process_group``'s keyword arguments. A group that is already initialised is joined as it is. An exit
    handler shuts the group down in scripts that never call ``end_training()`` (see :func:`release_at_shutdown`).

    With one process, the environment of one process (``DistributedType.NO``) and no group, unless ``alone``:
    then a group of one all the same (an in-memory store), for libraries that need ``torch.distributed`` even
    in one process (FSDP2's ``fully_shard``, ``torch.distributed.checkpoint``, DeepSpeed's engine). A library
    that forms its own group only when none exists (``deepspeed.init_distributed``) adopts this one when
    called after it.
    """
    import torch.distributed as dist

    from drivetrain.operations.torch_collectives import TorchCollectives

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    kwargs = dict(init_kwargs)
    backend = kwargs.pop("backend", None) or _default_torch_backend(device)
    timeout = kwargs.pop("timeout", None)
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    if timeout is not None:
        kwargs["timeout"] = timeout
    if device.type == "cuda" and (dist.is_initialized() or world_size > 1 or alone):
        torch.cuda.set_device(device)  # this process's GPU, also for a group the script initialised itself
    if not dist.is_initialized() and (world_size > 1 or alone):
        if world_size == 1:
            kwargs["store"] = dist.HashStore()
        else:
            _required_env("MASTER_ADDR")
            _required_env("MASTER_PORT")
            if device.type == "cuda" and backend == "nccl":
                kwargs["device_id"] = device
            if "init_method" not in kwargs and "TORCHELASTIC_RESTART_COUNT" in os.environ:
                kwargs["store"] = _store_for_this_attempt(world_size, rank, timeout)
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
        _install_exit_handler()
    if not dist.is_initialized():
        return DistributedEnvironment(distributed_type=DistributedType.NO)
    num_processes = dist.get_world_size()
    return DistributedEnvironment(
        num_processes=num_processes,
        process_index=dist.get_rank(),
        local_process_index=int(os.environ.get("LOCAL_RANK", "0")),
        local_num_processes=int(os.environ.get("LOCAL_WORLD_SIZE", str(num_processes))),
        distributed_type=_multi_process_type(device) if num_processes > 1 else DistributedType.NO,
        torch_backend=dist.get_backend(),
        collectives=TorchCollectives(),
        shutdown=shutdown_process_group,
    )
