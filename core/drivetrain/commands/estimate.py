"""Accelerate's ``accelerate.commands.estimate`` names, over ``drivetrain estimate-memory``
(:mod:`drivetrain.commands.estimate_memory`), which reads models from local files and caches (no Hub access)."""

from __future__ import annotations

import argparse
from typing import Any

from drivetrain.commands._entry import command_main, command_parser
from drivetrain.commands.estimate_memory import HELP, build_model, estimate, register_parser, run
from drivetrain.commands.estimate_memory import convert_bytes as _convert_bytes


def estimate_command(args: argparse.Namespace) -> int:
    return run(args)


estimate_command_parser = command_parser("estimate-memory", register_parser, estimate_command, HELP)
main = command_main(estimate_command_parser, estimate_command)


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """Accelerate's look-up of ``repo`` on the Hugging Face Hub: its ``ModelInfo``; ``"gated"`` when the
    repository is gated or cannot be read (no network, offline mode: Accelerate answers the same); ``"repo"``
    when it does not exist. ``drivetrain estimate-memory`` does not call it (it reads local files and caches);
    it needs ``huggingface_hub``."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError
    except ImportError:
        raise ImportError("verify_on_hub needs huggingface_hub: pip install huggingface_hub") from None
    try:
        return huggingface_hub.model_info(repo, token=token)
    except GatedRepoError:
        return "gated"
    except RepositoryNotFoundError:
        return "repo"
    except OSError:
        return "gated"


def add_timm_hub_prefix(model_name: str) -> str:
    """``owner/name`` -> ``hf-hub:owner/name`` (what timm needs for a Hub id); bare architecture names and names
    with a source prefix stay as they are."""
    return model_name if ":" in model_name or "/" not in model_name else f"hf-hub:{model_name}"


def check_has_model(error: BaseException) -> str:
    """Which library failed to find a model, from its error: ``"timm"``, ``"transformers"`` or ``"unknown"``."""
    from drivetrain.compat.accelerate_api.availability_checks import (
        is_timm_available,
        is_transformers_available,
    )

    message = str(error)
    if is_timm_available() and (
        (isinstance(error, RuntimeError) and "Unknown model" in message)
        or type(error).__name__ == "EntryNotFoundError"
        or (isinstance(error, KeyError) and "architecture" in message)
    ):
        return "timm"
    if is_transformers_available() and isinstance(error, OSError | ValueError):
        if "does not appear to have a file named" in message or "Unrecognized model in" in message:
            return "transformers"
    return "unknown"


def create_empty_model(
    model_name: str,
    library_name: str | None,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> Any:
    """The model ``model_name`` built on the meta device (no memory), from a local folder, config file,
    ``module:Class`` or a model in the local cache."""
    return build_model(model_name, library_name, trust_remote_code)


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """A boxed text table: ``title`` centred on top, then ``headers`` and ``rows``, columns centred."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    inner = sum(widths) + len(widths) - 1
    if len(title) > inner:
        widths[-1] += len(title) - inner
        inner = len(title)

    def line(cells: list[str]) -> str:
        return "│" + "│".join(str(cell).center(width) for cell, width in zip(cells, widths)) + "│"

    return "\n".join(
        [
            "┌" + "─" * inner + "┐",
            "│" + title.center(inner) + "│",
            "├" + "┬".join("─" * width for width in widths) + "┤",
            line(headers),
            "├" + "┼".join("─" * width for width in widths) + "┤",
            *(line(row) for row in rows),
            "└" + "┴".join("─" * width for width in widths) + "┘",
        ]
    )


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """``[dtype, largest layer bytes, total bytes, Adam training bytes]`` per dtype of ``args.dtypes``."""
    model = create_empty_model(
        args.model_name, getattr(args, "library_name", None), getattr(args, "trust_remote_code", False)
    )
    dtypes = getattr(args, "dtypes", None) or ("float32", "float16", "int8", "int4")
    return [
        [row["dtype"], row["largest_layer"], row["total_size"], row["training_adam"]]
        for row in estimate(model, dtypes)
    ]


convert_bytes = _convert_bytes

__all__ = [
    "add_timm_hub_prefix",
    "check_has_model",
    "convert_bytes",
    "create_ascii_table",
    "create_empty_model",
    "estimate_command",
    "estimate_command_parser",
    "gather_data",
    "main",
    "verify_on_hub",
]
