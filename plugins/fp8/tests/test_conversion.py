"""torchao conversion through ``Accelerator(mixed_precision="fp8").prepare``: which layers become
``Float8Linear``, which stay, and that the prepared model still trains the user's parameters."""

from __future__ import annotations

import pytest
import torch

from drivetrain import Accelerator
from drivetrain_fp8.ao import converted_layer_names, find_first_last_linear_layers, has_ao_layers
from drivetrain_fp8.recipes import AORecipeKwargs


class Net(torch.nn.Module):
    """First and last Linear, a 64x64 and a 64x48 (converted), a 48x40 and a 40x64 (40 is not a multiple of
    16: kept), and a LayerNorm (never converted by torchao)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(24, 64)
        self.blocks = torch.nn.Sequential(
            torch.nn.Linear(64, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 48),
            torch.nn.ReLU(),
            torch.nn.Linear(48, 40),
            torch.nn.ReLU(),
            torch.nn.Linear(40, 64),
        )
        self.norm = torch.nn.LayerNorm(64)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(inputs))))


def linear_kinds(model: torch.nn.Module) -> dict[str, str]:
    return {
        name: type(module).__name__
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }


def test_module_filter_keeps_first_last_and_odd_sizes():
    torch.manual_seed(0)
    model = Accelerator(mixed_precision="fp8").prepare(Net())
    assert linear_kinds(model) == {
        "embed": "Linear",  # first Linear
        "blocks.0": "Float8Linear",
        "blocks.2": "Float8Linear",
        "blocks.4": "Linear",  # 48 -> 40
        "blocks.6": "Linear",  # 40 -> 64
        "head": "Linear",  # last Linear
    }
    assert converted_layer_names(model) == ["blocks.0", "blocks.2"]
    assert has_ao_layers(model)
    assert find_first_last_linear_layers(Net()) == ("embed", "head")


def test_own_module_filter():
    only_the_head = AORecipeKwargs(module_filter_func=lambda module, name: name == "head")
    model = Accelerator(mixed_precision="fp8", kwargs_handlers=[only_the_head]).prepare(Net())
    assert converted_layer_names(model) == ["head"]


def test_prepared_model_trains_the_users_parameters_in_bf16_autocast():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = Net()
    reference.load_state_dict(model.state_dict())
    accelerator = Accelerator(mixed_precision="fp8")
    model, optimizer = accelerator.prepare(model, optimizer)

    inputs = torch.randn(32, 24)
    outputs = model(inputs)
    # fp32 outputs (as for bf16), close to the fp32 model: fp8 e4m3 keeps ~2 significant digits
    assert outputs.dtype == torch.float32
    expected = reference(inputs)
    assert (outputs - expected).abs().max() < 0.05 * expected.abs().max()
    with accelerator.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")

    before = model.blocks[0].weight.detach().clone()
    accelerator.backward(outputs.square().mean())
    optimizer.step()
    # the optimizer built before prepare steps the converted layer's weight (the same Parameter)
    assert not torch.equal(model.blocks[0].weight, before)
    assert model.blocks[0].weight.grad is not None


def test_accelerates_mixed_precision_context_manager_is_the_declared_bf16_autocast():
    """Accelerate's utility asks the fp8 plugin's declaration (PluginInfo.autocast_dtype), as its hook does."""
    from drivetrain.utils import get_mixed_precision_context_manager
    from drivetrain_fp8.plugin import PLUGIN_INFO

    Accelerator(mixed_precision="fp8")
    assert PLUGIN_INFO.autocast_dtype == "bfloat16"
    with get_mixed_precision_context_manager(native_amp=True):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")


def test_preparing_twice_converts_once():
    accelerator = Accelerator(mixed_precision="fp8")
    model = accelerator.prepare(Net())
    kinds = linear_kinds(model)
    again = accelerator.prepare_model(model)
    assert linear_kinds(again) == kinds
    assert again(torch.randn(2, 24)).dtype == torch.float32


def test_evaluation_mode_converts_too():
    model = Accelerator(mixed_precision="fp8").prepare_model(Net(), evaluation_mode=True)
    assert converted_layer_names(model) == ["blocks.0", "blocks.2"]
    with torch.no_grad():
        assert model(torch.randn(4, 24)).shape == (4, 10)


def test_without_fp8_nothing_is_converted():
    model = Accelerator(mixed_precision="bf16").prepare(Net())
    assert set(linear_kinds(model).values()) == {"Linear"}


def test_bare_linear_is_refused():
    from drivetrain_fp8.ao import convert_model_to_fp8_ao

    with pytest.raises(ValueError, match="a bare nn.Linear is its own first and last layer"):
        convert_model_to_fp8_ao(torch.nn.Linear(16, 16))
