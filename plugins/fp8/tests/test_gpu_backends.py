"""Real training with TransformerEngine and MS-AMP. They need an NVIDIA GPU with fp8 (Ada, Hopper or newer)
and their libraries (transformer-engine builds against the CUDA toolkit; MS-AMP is built from source), so on
other machines these tests are skipped and say why (``pytest -rs`` prints the reason)."""

from __future__ import annotations

import pytest
import torch

from drivetrain import Accelerator
from drivetrain_fp8.backends import MSAMP, TRANSFORMER_ENGINE
from drivetrain_fp8.recipes import MSAMPRecipeKwargs, TERecipeKwargs


def fp8_gpu() -> str | None:
    """Why there is no fp8 GPU here, or None when there is one."""
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    if torch.cuda.get_device_capability() < (8, 9):
        return f"GPU {torch.cuda.get_device_name()} has no fp8 tensor cores (compute capability < 8.9)"
    return None


def skip_reason(library) -> str | None:
    if fp8_gpu() is not None:
        return f"{library.label} needs an NVIDIA GPU with fp8: {fp8_gpu()}"
    if not library.available:
        return f"{library.label} is not installed ({library.install})"
    return None


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 256),
        torch.nn.LayerNorm(256),
        torch.nn.Linear(256, 64),
    )


def train(accelerator, steps: int = 30) -> tuple[torch.nn.Module, list[float]]:
    model = make_model()
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(steps, 32, 64, generator=generator).to(accelerator.device)
    losses = []
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(inputs[step]), inputs[step].sin())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


@pytest.mark.skipif(skip_reason(TRANSFORMER_ENGINE) is not None, reason=str(skip_reason(TRANSFORMER_ENGINE)))
def test_transformer_engine_trains_like_bf16():
    from drivetrain_fp8.transformer_engine import has_transformer_engine_layers

    _, bf16 = train(Accelerator(mixed_precision="bf16"))
    model, fp8 = train(
        Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(fp8_format="HYBRID")])
    )
    assert has_transformer_engine_layers(model)
    assert fp8[-1] < 0.5 * fp8[0]
    assert abs(fp8[-1] - bf16[-1]) / bf16[-1] < 0.1


@pytest.mark.skipif(skip_reason(MSAMP) is not None, reason=str(skip_reason(MSAMP)))
@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_msamp_trains(opt_level):
    model, losses = train(
        Accelerator(mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs(opt_level=opt_level)])
    )
    assert losses[-1] < 0.5 * losses[0]
