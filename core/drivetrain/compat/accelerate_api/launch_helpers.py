"""Accelerate's helpers of the launchers (``accelerate.utils.launch``, served at ``drivetrain.utils.launch``):
a path-list variable extended, the function each forked worker runs, and a training script's arguments as
SageMaker hyperparameters. The command-line launcher is ``drivetrain launch`` (:mod:`drivetrain.commands.launch`);
backend-specific preparations come from plugins."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def env_var_path_add(env_var_name: str, path_to_add: Any) -> str:
    """The value of the path-list variable ``env_var_name`` with ``path_to_add`` appended (not set: the caller
    sets it)."""
    paths = [path for path in os.environ.get(env_var_name, "").split(":") if path]
    return ":".join([*paths, str(path_to_add)])


class PrepareForLaunch:
    """``launcher`` made into the function each forked worker runs (``worker(index, *args)``): in debug mode it
    joins a gloo group through the rendezvous file of ``ACCELERATE_DEBUG_RDV_FILE``; for a multi-process
    ``distributed_type`` it sets ``LOCAL_RANK`` and ``RANK`` (from ``NPROC`` and ``NODE_RANK``); then it marks the
    process ``FORK_LAUNCHED`` and calls ``launcher(*args)``."""

    def __init__(self, launcher: Callable, distributed_type: Any = "NO", debug: bool = False):
        from drivetrain.config.enums import DistributedType

        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> None:
        if self.debug:
            import torch.distributed

            world_size = int(os.environ["WORLD_SIZE"])
            store = torch.distributed.FileStore(os.environ["ACCELERATE_DEBUG_RDV_FILE"], world_size)
            torch.distributed.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type.value.startswith("MULTI_"):
            os.environ["LOCAL_RANK"] = str(index)
            processes_per_node = int(os.environ.get("NPROC", 1))
            os.environ["RANK"] = str(processes_per_node * int(os.environ.get("NODE_RANK", 0)) + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)


def _convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
    """The training script's ``--name value`` arguments as SageMaker hyperparameters: ``{"name": value}`` with
    ``True``/``False`` as bools and numbers as int (whole) or float. SageMaker passes every hyperparameter with a
    value, so a flag without one (argparse's ``store_true``) is a ValueError."""

    def is_option(token: str) -> bool:
        if not token.startswith("-"):
            return False
        try:
            float(token)  # a negative number is a value
        except ValueError:
            return True
        return False

    def typed(value: str) -> Any:
        if value in ("True", "False"):
            return value == "True"
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() else number

    hyperparameters: dict[str, Any] = {}
    index = 0
    while index < len(nargs):
        token = nargs[index]
        if not is_option(token):
            raise ValueError(
                f"training script argument {token!r} is not a --name: pass hyperparameters as --name value"
            )
        name, has_inline, inline = token.lstrip("-").partition("=")
        if has_inline:
            value, index = inline, index + 1
        elif index + 1 < len(nargs) and not is_option(nargs[index + 1]):
            value, index = nargs[index + 1], index + 2
        else:
            raise ValueError(
                f"training script flag {token!r} has no value: SageMaker does not support argparse store_true/"
                "store_false flags; give it an explicit value (e.g. True or False)"
            )
        hyperparameters[name.replace("-", "_")] = typed(value)
    return hyperparameters
