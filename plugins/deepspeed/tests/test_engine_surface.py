"""Accelerate's DeepSpeed helpers on real engines (one process, gloo group of one): the wrappers ``prepare``
returns, ``is_train_batch_min``, ``map_pytorch_optim_to_deepspeed`` and transformers' view of the active
plugin."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from drivetrain_deepspeed.engine import records_of

from drivetrain import Accelerator
from drivetrain.utils import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedPlugin,
    DeepSpeedSchedulerWrapper,
    map_pytorch_optim_to_deepspeed,
)

pytestmark = pytest.mark.usefixtures("one_process")


def loader(batch_size: int, seed: int = 0) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 3, generator=generator)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, 10 * x.sum(1, keepdim=True)), batch_size
    )


@pytest.mark.parametrize(("is_train_batch_min", "expected"), [(True, 4), (False, 8)])
def test_train_and_eval_loaders_decide_the_micro_batch(is_train_batch_min, expected):
    accelerator = Accelerator(
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=1, is_train_batch_min=is_train_batch_min)
    )
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator.prepare(model, optimizer, loader(4), loader(8))
    config = records_of(accelerator)[-1].config
    assert config["train_micro_batch_size_per_gpu"] == expected and config["train_batch_size"] == expected


def test_wrappers_drive_the_engine_like_a_plain_training_step():
    """``DeepSpeedEngineWrapper(engine).backward(loss)`` is one whole step (clipped at the config's norm) and
    equals plain torch's; the prepared optimizer is a ``DeepSpeedOptimizerWrapper`` whose step does nothing."""
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    reference = copy.deepcopy(model)
    engine, optimizer, batches = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.1), loader(4)
    )
    assert isinstance(optimizer, DeepSpeedOptimizerWrapper)

    x, y = next(iter(batches))
    wrapper = DeepSpeedEngineWrapper(engine)
    wrapper.backward(torch.nn.functional.mse_loss(engine(x), y))
    optimizer.step()  # no second step: the engine stepped inside backward
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    reference_optimizer.step()
    assert float(norm) > 1.0  # the clip mattered
    assert wrapper.get_global_grad_norm() == pytest.approx(float(norm), rel=1e-5)
    assert optimizer.step_was_skipped is False
    for mine, theirs in zip(engine.module.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=0, atol=1e-6)

    # A scheduler the engine steps itself: the wrapper's step leaves the learning rate alone.
    plain = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    wrapped = DeepSpeedSchedulerWrapper(
        torch.optim.lr_scheduler.LambdaLR(plain, lambda step: 0.5**step), plain
    )
    wrapped.step()
    assert wrapped.get_last_lr() == [0.1] and plain.param_groups[0]["lr"] == 0.1


class _Built(torch.optim.Optimizer):
    """Stands in for a DeepSpeed CPU optimizer (building the real one compiles a C++ op: over 10 minutes on a
    busy 2-core machine), recording how it was built."""

    def __init__(self, model_params, lr=1e-3, weight_decay=0.0, **kwargs):
        super().__init__(model_params, {"lr": lr, "weight_decay": weight_decay})
        self.built_with = {"lr": lr, "weight_decay": weight_decay, **kwargs}


def test_map_pytorch_optim_to_deepspeed_picks_deepspeeds_twin(monkeypatch):
    """AdamW -> DeepSpeedCPUAdam with decoupled decay, Adam -> L2 decay, Adagrad -> DeepSpeedCPUAdagrad; each
    over the torch optimizer's own parameter groups (so per-group betas/eps carry over), lr and weight decay,
    with the keyword arguments DeepSpeed's constructors take."""
    import inspect

    import deepspeed.ops.adagrad
    import deepspeed.ops.adam

    for real, extra in (
        (deepspeed.ops.adam.DeepSpeedCPUAdam, {"adamw_mode"}),
        (deepspeed.ops.adagrad.DeepSpeedCPUAdagrad, set()),
    ):
        accepted = set(inspect.signature(real.__init__).parameters)
        assert {"model_params", "lr", "weight_decay", *extra} <= accepted, real
    adam_class = type("DeepSpeedCPUAdam", (_Built,), {})
    adagrad_class = type("DeepSpeedCPUAdagrad", (_Built,), {})
    monkeypatch.setattr(deepspeed.ops.adam, "DeepSpeedCPUAdam", adam_class)
    monkeypatch.setattr(deepspeed.ops.adagrad, "DeepSpeedCPUAdagrad", adagrad_class)

    model = torch.nn.Linear(3, 1)
    groups = [{"params": [model.weight], "betas": (0.8, 0.9)}, {"params": [model.bias], "weight_decay": 0.0}]
    adamw = torch.optim.AdamW(groups, lr=0.05, weight_decay=0.1)
    mapped = map_pytorch_optim_to_deepspeed(adamw)
    assert type(mapped) is adam_class
    assert mapped.built_with == {"lr": 0.05, "weight_decay": 0.1, "adamw_mode": True}
    assert [group["params"] for group in mapped.param_groups] == [[model.weight], [model.bias]]
    assert mapped.param_groups[0]["betas"] == (0.8, 0.9) and mapped.param_groups[1]["weight_decay"] == 0.0

    adam = map_pytorch_optim_to_deepspeed(torch.optim.Adam(model.parameters(), lr=0.01))
    assert type(adam) is adam_class and adam.built_with["adamw_mode"] is False
    adagrad = map_pytorch_optim_to_deepspeed(
        torch.optim.Adagrad(model.parameters(), lr=0.02, weight_decay=0.3)
    )
    assert type(adagrad) is adagrad_class and adagrad.built_with == {"lr": 0.02, "weight_decay": 0.3}


@pytest.mark.skipif(
    not os.environ.get("DRIVETRAIN_TEST_COMPILED_OPS"),
    reason="builds DeepSpeed's cpu_adam C++ op (over 10 minutes on a busy 2-core machine); set DRIVETRAIN_TEST_COMPILED_OPS=1",
)
def test_map_pytorch_optim_to_deepspeed_steps_like_the_torch_optimizer():
    """The real DeepSpeedCPUAdam built from a torch AdamW makes the same updates as that AdamW."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    twin = copy.deepcopy(model)
    mapped = map_pytorch_optim_to_deepspeed(torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1))
    assert isinstance(mapped, DeepSpeedCPUAdam) and mapped.adam_w_mode
    torch_adamw = torch.optim.AdamW(twin.parameters(), lr=0.05, weight_decay=0.1)
    x, y = next(iter(loader(4)))
    for _ in range(3):
        for net, optimizer in ((model, mapped), (twin, torch_adamw)):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
    for mine, theirs in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)


def test_transformers_sees_the_selected_plugin():
    """Selecting the ZeRO-3 teacher makes transformers create models partitioned (``from_config`` under
    ``deepspeed.zero.Init``); selecting the ZeRO-2 student switches it back. The partitioned teacher computes
    what the same weights compute in a plain model."""
    transformers = pytest.importorskip("transformers")
    from transformers.integrations import deepspeed_config, is_deepspeed_zero3_enabled

    plugins = {
        "student": DeepSpeedPlugin(zero_stage=2),
        "teacher": DeepSpeedPlugin(
            hf_ds_config={"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}
        ),
    }
    accelerator = Accelerator(deepspeed_plugins=plugins)
    assert not is_deepspeed_zero3_enabled()
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )

    accelerator.state.select_deepspeed_plugin("teacher")
    assert is_deepspeed_zero3_enabled() and deepspeed_config()["zero_optimization"]["stage"] == 3
    teacher = transformers.AutoModel.from_config(config)
    assert all(hasattr(parameter, "ds_id") for parameter in teacher.parameters())
    teacher = accelerator.prepare_model(teacher, evaluation_mode=True)
    teacher.eval()
    weights = teacher.full_state_dict()

    accelerator.state.select_deepspeed_plugin("student")
    assert not is_deepspeed_zero3_enabled()
    plain = transformers.AutoModel.from_config(config)
    assert not any(hasattr(parameter, "ds_id") for parameter in plain.parameters())
    plain.load_state_dict(weights)
    plain.eval()
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(
            teacher(input_ids=ids).last_hidden_state,
            plain(input_ids=ids).last_hidden_state,
            rtol=0,
            atol=1e-5,
        )


def test_set_deepspeed_weakref_without_an_accelerator():
    pytest.importorskip("transformers")
    from transformers.integrations import deepspeed_config, is_deepspeed_zero3_enabled

    from drivetrain.state import reset_state

    reset_state()
    plugin = DeepSpeedPlugin(zero_stage=3, offload_param_device="cpu")
    plugin.set_deepspeed_weakref()
    assert is_deepspeed_zero3_enabled() and plugin.dschf is not None
    assert deepspeed_config()["zero_optimization"]["offload_param"] == {"device": "cpu"}
    DeepSpeedPlugin(zero_stage=2).set_deepspeed_weakref()
    assert not is_deepspeed_zero3_enabled()
