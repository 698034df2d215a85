"""NVIDIA TransformerEngine: swap layers for ``te`` layers and run forward under TE's fp8 autocast.

TransformerEngine renamed things across releases (``fp8_autocast(fp8_recipe=)`` became
``autocast(recipe=)``; ``DelayedScaling`` lost ``interval`` and ``override_linear_precision`` in 2.x). The
recipe is built from the fields the installed ``DelayedScaling`` declares: a field it no longer has is
dropped while it holds Accelerate's default, and is an error naming the field when the script set it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError


def _te() -> Any:
    try:
        import transformer_engine.pytorch as te
    except ImportError as error:
        raise ImportError(
            f"transformer_engine does not import here ({error}); it needs an NVIDIA GPU and "
            "pip install --no-build-isolation transformer-engine[pytorch]"
        ) from error
    return te


def convert_model(
    model: torch.nn.Module,
    to_transformer_engine: bool = True,
    _convert_linear: bool = True,
    _convert_ln: bool = True,
) -> None:
    """Swap ``model``'s ``nn.Linear`` (dimensions multiples of 16) and ``nn.LayerNorm`` layers for
    TransformerEngine's, weights copied, in place; ``to_transformer_engine=False`` swaps back."""
    te = _te()
    for name, child in list(model.named_children()):
        replacement = None
        if to_transformer_engine and _convert_linear and type(child) is torch.nn.Linear:
            if child.in_features % 16 == 0 and child.out_features % 16 == 0:
                replacement = te.Linear(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    params_dtype=child.weight.dtype,
                )
        elif to_transformer_engine and _convert_ln and type(child) is torch.nn.LayerNorm:
            replacement = te.LayerNorm(
                child.normalized_shape[0], eps=child.eps, params_dtype=child.weight.dtype
            )
        elif not to_transformer_engine and _convert_linear and isinstance(child, te.Linear):
            replacement = torch.nn.Linear(
                child.in_features, child.out_features, bias=child.bias is not None, dtype=child.weight.dtype
            )
        elif not to_transformer_engine and _convert_ln and isinstance(child, te.LayerNorm):
            replacement = torch.nn.LayerNorm(
                child.weight.shape[0], eps=child.eps, dtype=child.weight.dtype, device=child.weight.device
            )
        if replacement is None:
            convert_model(child, to_transformer_engine, _convert_linear, _convert_ln)
            continue
        with torch.no_grad():
            replacement.weight.copy_(child.weight)
            if getattr(child, "bias", None) is not None:
                replacement.bias.copy_(child.bias)
        setattr(model, name, replacement)


def has_transformer_engine_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds TransformerEngine layers (Linear, LayerNorm, TransformerLayer)."""
    te = _te()
    kinds = tuple(
        getattr(te, kind) for kind in ("Linear", "LayerNorm", "TransformerLayer") if hasattr(te, kind)
    )
    return any(isinstance(module, kinds) for module in model.modules())


def te_autocast(enabled: bool, recipe: Any) -> Any:
    """TransformerEngine's fp8 autocast context, under its current or its older name."""
    te = _te()
    if hasattr(te, "autocast"):
        return te.autocast(enabled=enabled, recipe=recipe)
    return te.fp8_autocast(enabled=enabled, fp8_recipe=recipe)


def contextual_fp8_autocast(
    model_forward: Callable, fp8_recipe: Any, use_during_eval: bool = False
) -> Callable:
    """Wrap ``model_forward`` so it runs under fp8 autocast while the module trains (and in eval mode too
    with ``use_during_eval``; high precision usually gives better evaluation metrics). The result takes the
    module as first argument (bind it with ``types.MethodType``); ``__wrapped__`` is the original."""

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        with te_autocast(enabled=use_during_eval or self.training, recipe=fp8_recipe):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward  # type: ignore[attr-defined]
    return forward


def apply_fp8_autowrap(model: torch.nn.Module, fp8_recipe_handler: Any = None) -> torch.nn.Module:
    """Make ``model.forward`` run under fp8 autocast with the recipe of ``fp8_recipe_handler`` (a
    ``TERecipeKwargs``/``FP8RecipeKwargs``; None: Accelerate's defaults). Returns ``model``."""
    from drivetrain_fp8.recipes import TERecipeKwargs

    handler = fp8_recipe_handler if fp8_recipe_handler is not None else TERecipeKwargs()
    recipe = build_recipe(handler)
    forward = contextual_fp8_autocast(model.forward, recipe, bool(handler.use_autocast_during_eval))
    model.forward = types.MethodType(forward, model)  # type: ignore[method-assign]
    return model


def build_recipe(handler: Any) -> Any:
    """The TransformerEngine recipe object for a TERecipeKwargs/FP8RecipeKwargs."""
    te_recipe = importlib.import_module("transformer_engine.common.recipe")
    if handler.use_mxfp8_block_scaling:
        supported, reason = mxfp8_support()
        if not supported:
            raise ConfigurationError(
                f"{type(handler).__name__}.use_mxfp8_block_scaling: MXFP8 is not available: {reason}"
            )
        recipe_class = te_recipe.MXFP8BlockScaling
    else:
        recipe_class = te_recipe.DelayedScaling
    arguments = recipe_arguments(handler, recipe_class.__name__, recipe_fields(recipe_class))
    if "fp8_format" in arguments:
        arguments["fp8_format"] = getattr(te_recipe.Format, arguments["fp8_format"])
    return recipe_class(**arguments)


#: the handler fields that are recipe arguments (the others steer the plugin)
RECIPE_FIELDS = (
    "margin",
    "interval",
    "fp8_format",
    "amax_history_len",
    "amax_compute_algo",
    "override_linear_precision",
)


def recipe_arguments(handler: Any, recipe_name: str, accepted: set[str]) -> dict[str, Any]:
    """The handler's recipe fields that ``recipe_name`` (with constructor arguments ``accepted``) takes. A
    field it does not take is dropped while it holds the default, an error when the script set it."""
    arguments: dict[str, Any] = {}
    for name in RECIPE_FIELDS:
        value = getattr(handler, name)
        if name in accepted:
            arguments[name] = value
        elif name in handler.given and value != handler.DEFAULTS[name]:
            raise ConfigurationError(
                f"{type(handler).__name__}.{name}={value!r}: the installed TransformerEngine's {recipe_name} "
                f"takes no {name!r}; leave it unset"
            )
    return arguments


def recipe_fields(recipe_class: type) -> set[str]:
    if dataclasses.is_dataclass(recipe_class):
        return {field.name for field in dataclasses.fields(recipe_class)}
    return set(inspect.signature(recipe_class).parameters)


def mxfp8_support() -> tuple[bool, str]:
    """(available, reason) from whichever TransformerEngine module offers ``check_mxfp8_support``."""
    for module_name in ("transformer_engine.pytorch.fp8", "transformer_engine.pytorch.quantization"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        check = getattr(module, "check_mxfp8_support", None)
        if check is not None:
            available, reason = check()
            return bool(available), str(reason)
    return False, "this TransformerEngine offers no check_mxfp8_support"
