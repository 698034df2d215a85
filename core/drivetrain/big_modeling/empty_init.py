"""Building a model without paying for its weights: create every parameter on another device."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool = False) -> Iterator[None]:
    """Create every parameter (and buffer, with ``include_buffers``) registered inside the block on ``device``.

    With ``device="meta"`` the model costs no memory (see :func:`init_empty_weights`); with ``"cuda"`` a
    model is built straight on the GPU without a CPU copy.
    """
    device = torch.device(device)
    if include_buffers:
        # The device context covers every factory call: buffers, but also tensors built in __init__.
        with device:
            yield
        return

    original_register = torch.nn.Module.register_parameter

    def register_parameter(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original_register(module, name, param)
        # Every registration gets a parameter of its own, as in Accelerate, even one already on ``device``: a
        # tie made by assignment inside the block (``head.weight = embed.weight``) is not kept, so sizes and
        # device maps count the two apart until the model re-ties them (transformers' ``model.tie_weights()``).
        if param is not None:
            data = param.data.to(device)
            param_class = type(param)
            if param_class is torch.nn.Parameter:
                moved = torch.nn.Parameter(data, requires_grad=param.requires_grad)
            else:  # quantized subclasses take their extra attributes as constructor arguments
                moved = param_class(data, requires_grad=param.requires_grad, **param.__dict__)
            moved.__dict__.update(param.__dict__)
            module._parameters[name] = moved

    torch.nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original_register  # type: ignore[method-assign]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Build a model skeleton on the meta device: shapes and dtypes, no memory, no random init.

    Buffers stay real by default (they are small, and often not in checkpoints); pass
    ``include_buffers=True`` to put them on meta too. Fill the skeleton with
    :func:`~drivetrain.big_modeling.load_checkpoint_and_dispatch`.
    """
    with init_on_device(torch.device("meta"), include_buffers=bool(include_buffers)):
        yield
