"""Joining the process group that torchrun (or drivetrain launch) describes in the environment."""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import sys
import weakref
from typing import Any

import torch

from drivetrain.plugin_api import DistributedEnvironment, DistributedType, TorchCollectives

#: torch.distributed backend for each device type (gloo where nothing faster exists).
TORCH_BACKEND_FOR_DEVICE = {"cuda": "nccl", "xpu": "xccl", "cpu": "gloo"}
DISTRIBUTED_TYPE_FOR_DEVICE = {
    "cuda": DistributedType.MULTI_GPU,
    "xpu": DistributedType.MULTI_XPU,
    "npu": DistributedType.MULTI_NPU,
    "cpu": DistributedType.MULTI_CPU,
}


#: Every DistributedDataParallel wrapper this process built (see :func:`track_wrapped_model`).
_wrapped_models: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def track_wrapped_model(model: torch.nn.Module) -> None:
    """Remember a DDP wrapper so that shutdown can release it before the process group goes away."""
    _wrapped_models.add(model)


def release_wrapped_models() -> None:
    """Drop what each DDP wrapper holds of the process group (its reducer, logger, grad hooks and comm
    hooks).

    Why: the C++ reducer keeps the gloo process group alive; if it survives ``destroy_process_group`` it is
    destroyed during interpreter teardown, while gloo's threads may still be joinable, and the process
    aborts ("terminate called without an active exception"). After this the wrapper can no longer run a
    training step; ``accelerator.unwrap_model(model)`` (or ``model.module``) still works.
    """
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
    """Meet the other ranks, release the DDP wrappers, destroy the default process group. Idempotent.

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
    release_wrapped_models()
    dist.destroy_process_group()


#: Set when this process dies of an uncaught exception: its peers will not come to the exit barrier.
_died_of_exception = False


def _note_uncaught_exception(previous_hook: Any) -> Any:
    def hook(*args: Any) -> None:
        global _died_of_exception
        _died_of_exception = True
        previous_hook(*args)

    return hook


def _exit_barrier_timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=float(os.environ.get("DRIVETRAIN_DDP_EXIT_TIMEOUT", "60")))


def _shutdown_at_exit() -> None:
    """atexit: a script that never called ``end_training`` / ``destroy_process_group`` still exits 0.

    A rank that failed skips the barrier (its peers are not coming; torchrun stops them), and a rank whose
    peers do not arrive within ``DRIVETRAIN_DDP_EXIT_TIMEOUT`` seconds (default 60) gives up waiting.
    """
    if _died_of_exception:
        return
    try:
        shutdown_process_group(barrier_timeout=_exit_barrier_timeout())
    except Exception as exc:  # a peer that already left must not turn a finished run into a failure
        print(
            f"drivetrain-ddp: process group shutdown at exit failed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"the ddp backend needs the environment variable {name}, which torchrun / drivetrain launch sets; "
            "start the script with `drivetrain launch --num_processes N script.py`"
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


def join_process_group(device: torch.device, init_kwargs: dict[str, Any]) -> DistributedEnvironment:
    """Initialise torch.distributed from RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT."""
    import torch.distributed as dist

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    kwargs = dict(init_kwargs)
    backend = kwargs.pop("backend", None) or TORCH_BACKEND_FOR_DEVICE.get(device.type, "gloo")
    timeout = kwargs.pop("timeout", None)
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    if world_size > 1 and not dist.is_initialized():
        _required_env("MASTER_ADDR")
        _required_env("MASTER_PORT")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        extra: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        if device.type == "cuda" and backend == "nccl":
            extra["device_id"] = device
        if "init_method" not in kwargs and "TORCHELASTIC_RESTART_COUNT" in os.environ:
            extra["store"] = _store_for_this_attempt(world_size, rank, timeout)
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **extra, **kwargs)
        # Registered after init_process_group so it runs before torch's own exit handlers.
        atexit.register(_shutdown_at_exit)
        sys.excepthook = _note_uncaught_exception(sys.excepthook)
    if not dist.is_initialized():
        # One process asked for DDP: behave like the reference backend.
        return DistributedEnvironment(distributed_type=DistributedType.NO)

    return DistributedEnvironment(
        num_processes=dist.get_world_size(),
        process_index=dist.get_rank(),
        local_process_index=local_rank,
        local_num_processes=local_world_size,
        distributed_type=DISTRIBUTED_TYPE_FOR_DEVICE.get(device.type, DistributedType.MULTI_CPU),
        torch_backend=dist.get_backend(),
        collectives=TorchCollectives(),
        shutdown=shutdown_process_group,
    )
