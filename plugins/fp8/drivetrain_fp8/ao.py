"""torchao float8 training: swap ``nn.Linear`` layers for ``Float8Linear`` in place.

Which layers are converted (the module filter, as Accelerate does): every ``nn.Linear`` except the first and
the last one of the model (converting them tends to keep a model from training well) and except layers whose
``in_features`` or ``out_features`` is not a multiple of 16 (float8 matmuls need that). A recipe's own
``module_filter_func(module, name)`` replaces this rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """Names of the first and the last ``nn.Linear`` in ``model.named_modules()`` order."""
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str | None]) -> bool:
    """Whether to convert ``module`` (named ``fqn``): a Linear whose dimensions are multiples of 16 and whose
    name is not in ``layers_to_filter``."""
    if isinstance(module, torch.nn.Linear) and (module.in_features % 16 or module.out_features % 16):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """Accelerate's helper of this name, kept for scripts that pass it as ``module_filter_func``. Called per
    layer, the "first and last" it finds are the layer itself (named ``""``), so in effect it checks the
    dimensions only; conversion's default is :func:`default_module_filter`, which sees the whole model."""
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def default_module_filter(model: torch.nn.Module) -> Callable[[torch.nn.Module, str], bool]:
    """The reference filter for ``model``: keep its first and last Linear and odd-sized ones in high
    precision."""
    first, last = find_first_last_linear_layers(model)
    return functools.partial(filter_linear_layers, layers_to_filter=[first, last])


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds torchao ``Float8Linear`` layers."""
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


def convert_model_to_fp8_ao(
    model: torch.nn.Module,
    config: Any = None,
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None,
) -> None:
    """Convert ``model``'s Linear layers to ``Float8Linear`` in place (``config``: a torchao
    ``Float8LinearConfig``, default torchao's; ``module_filter_func``: which layers, default
    :func:`default_module_filter`)."""
    from torchao.float8 import convert_to_float8_training

    if isinstance(model, torch.nn.Linear):
        raise ValueError(
            "convert_model_to_fp8_ao converts the Linear layers inside a model in place; a bare nn.Linear "
            "is its own first and last layer and stays in high precision"
        )
    if module_filter_func is None:
        module_filter_func = default_module_filter(model)
    convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)


def converted_layer_names(model: torch.nn.Module) -> list[str]:
    """Names of the ``Float8Linear`` layers in ``model`` (what the conversion touched)."""
    from torchao.float8.float8_linear import Float8Linear

    return [name for name, module in model.named_modules() if isinstance(module, Float8Linear)]


def precompute_scales_after_step(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> Any:
    """With FSDP2 float8 all-gather: after each optimizer step compute every weight's float8 scale in one
    all-reduce for all layers (instead of one per layer in the next forward). Returns the hook handle."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    def hook(*_args: Any, **_kwargs: Any) -> None:
        precompute_float8_dynamic_scale_for_fsdp(model)

    return optimizer.register_step_post_hook(hook)
