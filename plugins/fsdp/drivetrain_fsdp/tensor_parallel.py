"""Tensor parallelism: ``torch.distributed.tensor.parallel.parallelize_module`` over the mesh's ``tp``
dimension, before FSDP2 shards the result over the data-parallel dimensions (2-D: each parameter a DTensor
sharded over both).

The plan, first found wins:

1. ``TorchTensorParallelConfig(tp_plan={...})`` of the run's ``ParallelismConfig``;
2. the model's own plan (a transformers model's ``tp_plan``: ``{"model.layers.*.mlp.up_proj": "colwise", ...}``);
3. none needed: the model's parameters are already tensor-parallel DTensors (a transformers model loaded with
   ``from_pretrained(tp_plan="auto", device_mesh=...)``), as Accelerate expects.

Style names are transformers' (``STYLES``); a plan value may also be a torch ``ParallelStyle``.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError


def _styles() -> dict[str, Any]:
    """transformers' style names -> the torch ParallelStyle that does the same."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "colwise": ColwiseParallel(),
        "rowwise": RowwiseParallel(),
        "colwise_rep": ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": RowwiseParallel(input_layouts=Replicate()),
        "rowwise_split_input": RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": RowwiseParallel(input_layouts=Replicate()),
        "embedding_colwise": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1)),
        "sequence_parallel": SequenceParallel(),
        # left whole on every rank (its gradients are equal there: every rank sees the same batch)
        "replicate": None,
    }


STYLE_NAMES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "colwise_gather_output",
    "rowwise_rep",
    "rowwise_split_input",
    "embedding_rowwise",
    "embedding_colwise",
    "sequence_parallel",
    "replicate",
)


def is_tensor_parallel(model: torch.nn.Module) -> bool:
    """Whether some parameter is already a DTensor placed over a ``tp`` mesh dimension."""
    from torch.distributed.tensor import DTensor

    for parameter in model.parameters():
        if isinstance(parameter, DTensor) and "tp" in (parameter.device_mesh.mesh_dim_names or ()):
            return True
    return False


def model_plan(model: torch.nn.Module) -> dict[str, Any] | None:
    """The model's own plan (transformers keeps it in ``tp_plan`` / ``_tp_plan``), or None."""
    for attribute in ("tp_plan", "_tp_plan"):
        plan = getattr(model, attribute, None)
        if isinstance(plan, dict) and plan:
            return dict(plan)
    return None


def resolve_plan(plan: dict[str, Any], where: str) -> dict[str, Any]:
    """Style names replaced by ParallelStyles; ``replicate`` entries dropped. Unknown names are an error
    listing the known ones."""
    from torch.distributed.tensor.parallel import ParallelStyle

    styles = _styles()
    resolved = {}
    for name, style in plan.items():
        if isinstance(style, str):
            if style not in styles:
                raise ConfigurationError(
                    f"{where}: module {name!r} has tensor-parallel style {style!r}, which drivetrain-fsdp does not "
                    f"know; use one of {', '.join(STYLE_NAMES)} or a torch ParallelStyle"
                )
            style = styles[style]
            if style is None:
                continue
        elif not isinstance(style, ParallelStyle):
            raise ConfigurationError(
                f"{where}: module {name!r} maps to {style!r}; a plan maps module names to style names or "
                "torch.distributed.tensor.parallel.ParallelStyle objects"
            )
        resolved[name] = style
    return resolved


def apply_tensor_parallel(model: torch.nn.Module, mesh: Any, handler: Any) -> None:
    """Shard ``model`` over ``mesh["tp"]`` in place with the plan found as the module docstring says."""
    from torch.distributed.tensor.parallel import parallelize_module

    user_plan = getattr(handler, "tp_plan", None)
    if user_plan:
        plan, where = resolve_plan(user_plan, "TorchTensorParallelConfig.tp_plan"), "tp_plan"
    elif is_tensor_parallel(model):
        return
    elif (own_plan := model_plan(model)) is not None:
        plan, where = (
            resolve_plan(own_plan, f"{type(model).__name__}.tp_plan"),
            "the model's tp_plan",
        )
    else:
        raise ConfigurationError(
            f"ParallelismConfig.tp_size={mesh['tp'].size()} but {type(model).__name__} has no tensor-parallel plan: "
            "pass ParallelismConfig(tp_handler=TorchTensorParallelConfig(tp_plan={module name: style})), use a "
            "transformers model (its tp_plan), or load it already sharded (from_pretrained(tp_plan='auto'))"
        )
    _check_plan_matches(model, plan, where)
    parallelize_module(model, mesh["tp"], plan)


def _check_plan_matches(model: torch.nn.Module, plan: dict[str, Any], where: str) -> None:
    """Every plan entry names at least one module (``*`` matches one level of names), so that a misspelt
    name is an error rather than a layer silently left whole."""
    import fnmatch

    names = [name for name, _ in model.named_modules() if name]
    for pattern in plan:
        parts = pattern.split(".")
        if not any(
            len(name.split(".")) == len(parts)
            and all(fnmatch.fnmatchcase(piece, part) for piece, part in zip(name.split("."), parts))
            for name in names
        ):
            raise ConfigurationError(
                f"{where}: {pattern!r} matches no module of {type(model).__name__} (module names look like "
                f"{', '.join(names[:4])}, ...)"
            )
