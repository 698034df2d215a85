"""``DeepSpeedPlugin.transformer_moe_cls_names``: mixture-of-experts blocks become ZeRO-3 leaf modules
(gathered whole), with a real one-process ZeRO-3 engine (gloo group of one)."""

from __future__ import annotations

import pytest
import torch
from drivetrain_deepspeed import DeepSpeedPlugin

from drivetrain import Accelerator
from drivetrain.errors import ConfigurationError

pytestmark = pytest.mark.usefixtures("one_process")


class SparseExperts(torch.nn.Module):
    """MoE-like block: each sample runs through one expert chosen by a router, so which expert's parameters a
    forward touches depends on the data (what breaks ZeRO-3's recorded prefetch order)."""

    def __init__(self, width: int = 4, experts: int = 3) -> None:
        super().__init__()
        self.router = torch.nn.Linear(width, experts)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.router(x).argmax(dim=-1)
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            rows = choice == index
            if rows.any():
                out[rows] = expert(x[rows])
        return x + out


class TinyMoE(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(3, 4)
        self.blocks = torch.nn.ModuleList([SparseExperts(), SparseExperts()])
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def prepare(plugin: DeepSpeedPlugin):
    torch.manual_seed(0)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = TinyMoE()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=4
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return accelerator, *accelerator.prepare(model, optimizer, loader)


@pytest.mark.parametrize("names", [["SparseExperts"], "SparseExperts", [f"{__name__}.SparseExperts"]])
def test_moe_blocks_become_zero3_leaf_modules_and_train(names):
    from deepspeed.utils import get_z3_leaf_modules, z3_leaf_module

    accelerator, model, optimizer, loader = prepare(
        DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names=names)
    )
    module = accelerator.unwrap_model(model)
    assert [type(m).__name__ for m in get_z3_leaf_modules(module)] == ["SparseExperts", "SparseExperts"]
    assert all(z3_leaf_module(block) for block in module.blocks)
    assert not any(z3_leaf_module(m) for m in (module, module.embed, module.head, module.blocks[0].router))
    before = model.full_state_dict()
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    after = model.full_state_dict()
    # The router's argmax passes no gradient; the experts that ran and the layers around them train.
    changed = {key for key in before if not torch.equal(after[key], before[key])}
    assert {"embed.weight", "head.weight"} <= changed
    assert any(key.startswith("blocks.0.experts.") for key in changed)


def test_without_moe_names_nothing_is_a_leaf():
    from deepspeed.utils import get_z3_leaf_modules

    accelerator, model, _, _ = prepare(DeepSpeedPlugin(zero_stage=3))
    assert get_z3_leaf_modules(accelerator.unwrap_model(model)) == []


def test_unknown_moe_class_name_is_an_error_naming_the_field_and_the_classes():
    with pytest.raises(ConfigurationError) as raised:
        prepare(DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names=["SparseExperts", "MixtralBlock"]))
    message = str(raised.value)
    assert "DeepSpeedPlugin.transformer_moe_cls_names" in message
    assert "'MixtralBlock'" in message and "TinyMoE" in message
    assert "Linear, ModuleList, SparseExperts, TinyMoE" in message
