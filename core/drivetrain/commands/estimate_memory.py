"""``drivetrain estimate-memory``: how much memory a model needs to load and to train with Adam, per dtype.

The model is built on the ``meta`` device (no weights are allocated or downloaded). It can be a local model
folder or ``config.json`` (transformers), a ``module:Class`` path (built with no arguments), or a transformers
or timm model name whose config is available offline (in the local cache).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

from drivetrain.commands.parsing import UsageError, add_option
from drivetrain.errors import ModelNotFoundError

HELP = "Estimate the memory a model needs for inference and for Adam training, per dtype."
#: bytes per parameter
DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5}
DEFAULT_DTYPES = ("float32", "float16", "int8", "int4")
#: weights + gradients + Adam's two moments, all in the same dtype (the seed's "Training using Adam" column)
ADAM_FACTOR = 4


def register_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_name", help="model folder, config.json, module:Class, or a cached model name")
    add_option(
        parser,
        "--library_name",
        choices=("transformers", "timm"),
        help="library of a model given by name (default: transformers, then timm)",
    )
    add_option(
        parser,
        "--dtypes",
        nargs="+",
        choices=list(DTYPE_BYTES),
        metavar="DTYPE",
        help=f"dtypes to show ({', '.join(DTYPE_BYTES)}; default: {' '.join(DEFAULT_DTYPES)})",
    )
    add_option(
        parser,
        "--trust_remote_code",
        action="store_true",
        help="allow a transformers model's own modeling code (only for code you trust)",
    )
    add_option(parser, "--json", action="store_true", help="print JSON")


def _meta():
    import torch

    return torch.device("meta")


def _from_transformers_config(config: Any, trust_remote_code: bool) -> Any:
    import transformers

    with _meta():
        return transformers.AutoModel.from_config(config, trust_remote_code=trust_remote_code)


def build_model(name: str, library: str | None = None, trust_remote_code: bool = False) -> Any:
    """The model on the meta device; raises UsageError saying what was tried."""
    path = Path(name).expanduser()
    if path.exists():
        folder = path.parent if path.is_file() else path
        if not (folder / "config.json").exists():
            raise UsageError(f"{name}: no config.json there (a model folder holds one)")
        transformers = _import("transformers", f"{name} is a transformers config")
        config = transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
        return _from_transformers_config(config, trust_remote_code)
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UsageError(f"{name}: cannot import module {module_name!r} ({exc})") from None
        target = getattr(module, attribute, None)
        if target is None or not callable(target):
            raise UsageError(f"{name}: module {module_name!r} has no class or function {attribute!r}")
        with _meta():
            try:
                return target()
            except TypeError as exc:
                raise UsageError(f"{name}: cannot build it without arguments ({exc})") from None
    tried = []
    for candidate in [library] if library else ["transformers", "timm"]:
        try:
            if candidate == "transformers":
                transformers = _import("transformers", f"--library_name transformers for {name}")
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                config = transformers.AutoConfig.from_pretrained(
                    name, local_files_only=True, trust_remote_code=trust_remote_code
                )
                return _from_transformers_config(config, trust_remote_code)
            timm = _import("timm", f"--library_name timm for {name}")
            with _meta():
                return timm.create_model(name, pretrained=False)
        except UsageError as exc:
            tried.append(str(exc))
        except Exception as exc:
            tried.append(f"{candidate}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    raise ModelNotFoundError(
        f"{name!r} is not a local folder, a config.json, a module:Class, or a model available "
        f"offline ({'; '.join(tried)})"
    )


def _import(module: str, why: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{why}, but {module} is not installed (pip install {module})") from None


def layer_units(model: Any) -> list[Any]:
    """The modules that are loaded as one piece: classes named in ``_no_split_modules``, else leaves."""
    no_split = set(getattr(model, "_no_split_modules", None) or ())
    units = []

    def walk(module: Any) -> None:
        children = list(module.children())
        if type(module).__name__ in no_split or not children:
            units.append(module)
            return
        if any(True for _ in module.parameters(recurse=False)):
            units.append(module)  # its own parameters count as a unit beside its children
        for child in children:
            walk(child)

    walk(model)
    return units


def _is_whole(unit: Any, model: Any) -> bool:
    no_split = set(getattr(model, "_no_split_modules", None) or ())
    return type(unit).__name__ in no_split or not list(unit.children())


def _numel(module: Any, recurse: bool = True) -> int:
    tensors = list(module.parameters(recurse=recurse)) + list(module.buffers(recurse=recurse))
    return sum(t.numel() for t in tensors)


def estimate(model: Any, dtypes: tuple[str, ...] | list[str] = DEFAULT_DTYPES) -> list[dict[str, Any]]:
    """Rows of bytes per dtype: largest layer, total size, training with Adam."""
    total = _numel(model)
    # A unit with children is a module listed only for its own parameters (see layer_units).
    largest = max((_numel(unit, recurse=_is_whole(unit, model)) for unit in layer_units(model)), default=0)
    rows = []
    for dtype in dtypes:
        size = DTYPE_BYTES[dtype]
        rows.append(
            {
                "dtype": dtype,
                "largest_layer": largest * size,
                "total_size": total * size,
                "training_adam": total * size * ADAM_FACTOR,
            }
        )
    return rows


def convert_bytes(size: float) -> str:
    """``1536`` -> ``1.5 KB`` (1024-based, as the seed's table)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{round(size, 2)} {unit}"
        size /= 1024
    return f"{size} PB"  # pragma: no cover


def format_table(name: str, rows: list[dict[str, Any]]) -> str:
    header = ("dtype", "Largest Layer", "Total Size", "Training using Adam")
    cells = [
        (
            r["dtype"],
            convert_bytes(r["largest_layer"]),
            convert_bytes(r["total_size"]),
            convert_bytes(r["training_adam"]),
        )
        for r in rows
    ]
    widths = [max(len(header[i]), *(len(c[i]) for c in cells)) for i in range(4)]

    def line(values: tuple[str, ...]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"

    return "\n".join(
        [
            f"Memory Usage for loading `{name}`:",
            "",
            line(header),
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
            *(line(c) for c in cells),
        ]
    )


def run(args: argparse.Namespace) -> int:
    model = build_model(args.model_name, args.library_name, args.trust_remote_code)
    rows = estimate(model, args.dtypes or DEFAULT_DTYPES)
    if args.json:
        print(json.dumps({"model": args.model_name, "rows": rows}, indent=2))
    else:
        print(format_table(args.model_name, rows))
    return 0
