"""Starting a function in several processes from Python: ``notebook_launcher`` (a notebook cell, one or
several machines) and ``debug_launcher`` (CPU processes on this machine, for tests). Accelerate's path for them
is ``drivetrain.launchers`` (generated from its table in drivetrain.compat.paths); ``drivetrain`` exports both.

Both fork the current process through torch's elastic launcher, so the function needs no pickling and sees
the notebook's globals. CUDA cannot survive a fork: if it was initialised before, a clear error says so.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
from collections.abc import Callable
from typing import Any

from drivetrain.config.environment_variables import patch_environment
from drivetrain.errors import DrivetrainError
from drivetrain.launching.ports import free_port


def _run_in_child(launcher_pid: int, function: Callable, args: tuple) -> Any:
    # What this process inherited is the parent's: collected here, garbage holding a torch store (a
    # finished launch's) would run its destructor, which joins a thread that only exists in the parent, and
    # hang the process. Frozen objects are never collected.
    gc.freeze()
    from drivetrain import rank_guard

    # A forked process dies with the notebook (or script) that launched it, even one killed with SIGKILL.
    if not rank_guard.die_with_parent(launcher_pid):
        os._exit(1)
    # The parent's shared state (a PartialState built in a notebook cell) describes one process; the child
    # must build its own from the launcher's environment.
    from drivetrain.contract.registry import reset_plugin_registry
    from drivetrain.state import reset_state

    reset_state()
    reset_plugin_registry()
    try:
        return function(*args)
    except BaseException as exc:
        # The error reaches the launching process on its channel (torch's way is a file in the temporary
        # folder, which a killed notebook would leave behind).
        import traceback

        from drivetrain.failure_report import report_failure

        report_failure(int(os.environ.get("RANK", "0")), exc, traceback.format_exc())
        raise


def _fork_launch(
    function: Callable,
    args: tuple,
    *,
    nprocs: int,
    master_addr: str,
    port: int,
    node_rank: int,
    num_nodes: int,
    rdzv_backend: str,
    max_restarts: int,
    monitor_interval: float,
    env: dict[str, str],
) -> dict[int, Any]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    rdzv_configs: dict[str, Any] = {"rank": node_rank} if rdzv_backend == "static" else {}
    config = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=nprocs,
        run_id="drivetrain-notebook",
        rdzv_endpoint=f"{master_addr}:{port}",
        rdzv_backend=rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method="fork",
        # torch's default makes a log folder in the temporary folder and leaves it there: no log files
        logs_specs=DefaultLogsSpecs(log_dir=os.devnull),
    )
    from drivetrain.launch_channel import LaunchChannel

    with (
        LaunchChannel() as channel,
        patch_environment(
            **{
                "FORK_LAUNCHED": "1",
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(port),
                **env,
                **channel.environment,
            }
        ),
    ):
        try:
            gc.collect()  # garbage of earlier launches is destroyed here, not in a forked child (_run_in_child)
            return elastic_launch(config, _run_in_child)(os.getpid(), function, args)
        except ChildFailedError as exc:
            recorded = channel.first_failure()
            if recorded is not None and recorded["rank"] in exc.failures:
                rank, error = recorded["rank"], recorded["error"]
            else:  # a process that died without a Python error (a signal, os._exit)
                rank, failure = exc.get_first_failure()
                error = failure.message
            message = f"process of rank {rank} failed (exit code {exc.failures[rank].exitcode}): {error}"
            raise _process_failed_class()(message, exc.name, exc.failures) from exc


@functools.cache
def _process_failed_class() -> type:
    """The error notebook_launcher raises when a process fails: a DrivetrainError with a one-line message,
    and torch's ChildFailedError (what Accelerate's notebook_launcher lets through, and its users catch).
    Built on first use, so importing drivetrain does not import torch.distributed.elastic."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    class ProcessFailedError(DrivetrainError, ChildFailedError):
        def __init__(self, message: str, name: str, failures: dict) -> None:
            ChildFailedError.__init__(self, name, failures)
            self.args = (message,)

        def __str__(self) -> str:
            return str(self.args[0])

    return ProcessFailedError


#: Libraries known to initialise the device when imported (Accelerate refuses to fork after they are imported).
DEVICE_INITIALISING_LIBRARIES = ("bitsandbytes",)


def _check_device_not_initialised() -> None:
    import torch

    imported = [name for name in DEVICE_INITIALISING_LIBRARIES if name in sys.modules]
    if imported:
        # RuntimeError, as Accelerate raises: a forked child would inherit the device state they set up.
        raise RuntimeError(
            "Could not start distributed processes: libraries that initialise the device when imported were "
            f"imported already ({', '.join(imported)}). Please keep these imports inside your training function"
        )
    if torch.cuda.is_initialized():
        raise DrivetrainError(
            "CUDA was initialised in this process before notebook_launcher could fork it, and CUDA cannot be "
            "used in forked processes. Restart the notebook and move every use of CUDA (model.cuda(), "
            "torch.cuda calls, an Accelerator) into the function you pass to notebook_launcher"
        )


def notebook_launcher(
    function: Callable,
    args: tuple = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> dict[int, Any] | Any:
    """Run ``function(*args)`` in ``num_processes`` processes on this machine (one of ``num_nodes``).

    With one process (or ``num_processes=None`` and fewer than two GPUs) the function runs here. Returns the
    function's result (one process) or a dict ``{rank: result}``. The config file is not read: everything
    comes from the arguments.
    """
    import torch

    from drivetrain.config.file import PRECISIONS

    if str(mixed_precision).lower() not in PRECISIONS:
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not valid; choose one of: {', '.join(PRECISIONS)}"
        )
    if rdzv_backend not in ("static", "c10d"):
        raise ValueError(f"rdzv_backend={rdzv_backend!r} is not valid; choose static or c10d")
    if num_processes is None:
        num_processes = torch.cuda.device_count() if torch.cuda.is_available() else 1
    env = {"DRIVETRAIN_MIXED_PRECISION": str(mixed_precision).lower()}
    if num_processes <= 1 and num_nodes <= 1:
        print(f"Launching training on one process ({'GPU' if torch.cuda.is_available() else 'CPU'}).")
        with patch_environment(**env):
            return function(*args)
    _check_device_not_initialised()
    if rdzv_endpoint:
        master_addr, _, port_text = rdzv_endpoint.rpartition(":")
        use_port = port_text
    device = "GPUs" if torch.cuda.is_available() else "CPU processes"
    print(
        f"Launching training on {num_processes} {device}"
        + (f" (machine {node_rank} of {num_nodes})." if num_nodes > 1 else ".")
    )
    return _fork_launch(
        function,
        args,
        nprocs=num_processes,
        master_addr=master_addr,
        port=int(use_port),
        node_rank=node_rank,
        num_nodes=num_nodes,
        rdzv_backend=rdzv_backend,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        env=env,
    )


def debug_launcher(function: Callable, args: tuple = (), num_processes: int = 2) -> dict[int, Any]:
    """Run ``function(*args)`` in ``num_processes`` CPU processes (gloo on loopback) to debug distributed
    code without GPUs. Returns ``{rank: result}``."""
    return _fork_launch(
        function,
        args,
        nprocs=num_processes,
        master_addr="127.0.0.1",
        port=free_port(),
        node_rank=0,
        num_nodes=1,
        rdzv_backend="static",
        max_restarts=0,
        monitor_interval=0.1,
        env={"DRIVETRAIN_CPU": "1"},
    )
