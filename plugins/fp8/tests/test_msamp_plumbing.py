"""The plugin's side of MS-AMP, on CPU: model and optimizer go to ``msamp.initialize`` together, the loss is
scaled in backward, unscaled before clipping, and the step goes through the GradScaler.

MS-AMP itself needs an NVIDIA GPU and is not on PyPI, so here ``msamp.initialize`` is a stand-in that returns
what it is given and records the call; the real library runs in test_gpu_backends.py where present. With
fp32 values and a power-of-two loss scale, scaling and unscaling are exact: training must equal plain torch.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from drivetrain import Accelerator, AutocastKwargs
from drivetrain.errors import ConfigurationError
from drivetrain_fp8 import backends, selection
from drivetrain_fp8.recipes import MSAMPRecipeKwargs


@pytest.fixture
def stand_in_msamp(monkeypatch):
    calls = []

    def initialize(model, optimizer, opt_level):
        calls.append((model, optimizer, opt_level))
        return model, optimizer

    monkeypatch.setitem(sys.modules, "msamp", types.SimpleNamespace(initialize=initialize))
    monkeypatch.setattr(backends, "module_installed", lambda module: module in ("torchao", "msamp"))
    monkeypatch.setattr(selection, "GPU_ONLY", ())  # the stand-in runs on CPU
    return calls


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def test_model_and_optimizer_go_together_and_train_like_torch(stand_in_msamp):
    data = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    targets = data.sum(dim=1, keepdim=True).sin()
    reference = make_model()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    # autocast off: compared in fp32
    handlers = [MSAMPRecipeKwargs(opt_level="O1"), AutocastKwargs(enabled=False)]
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=handlers)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert len(stand_in_msamp) == 1 and stand_in_msamp[0][2] == "O1"
    assert optimizer.scaler is not None and optimizer.scaler.get_scale() == 65536.0

    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(data), targets)
        accelerator.backward(loss)
        # the gradient seen here is scaled; clipping unscales it first
        norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=0.1)
        optimizer.step()
        optimizer.zero_grad()

        torch.nn.functional.mse_loss(reference(data), targets).backward()
        expected_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=0.1)
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        assert torch.allclose(norm, expected_norm, rtol=1e-6)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_model_without_its_optimizer_is_an_error(stand_in_msamp):
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs()])
    with pytest.raises(
        ConfigurationError, match="pass both to one accelerator.prepare\\(model, optimizer\\) call"
    ):
        accelerator.prepare(make_model())
    model = make_model()
    with pytest.raises(ConfigurationError, match="this prepare\\(\\) call holds 2 optimizers"):
        accelerator.prepare(
            model, torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)
        )
