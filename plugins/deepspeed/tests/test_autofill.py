""" "auto" values and their conflicts, with a real one-process DeepSpeed engine (gloo group of one)."""

from __future__ import annotations

import pytest
import torch
from drivetrain_deepspeed import DeepSpeedPlugin, DummyOptim, DummyScheduler
from drivetrain_deepspeed.engine import records_of

from drivetrain import Accelerator
from drivetrain.errors import ConfigurationError

pytestmark = pytest.mark.usefixtures("one_process")


def objects(batch_size: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=batch_size
    )
    return model, loader


def engine_config(accelerator) -> dict:
    return records_of(accelerator)[-1].config


def test_auto_values_come_from_accelerator_and_loader():
    accelerator = Accelerator(
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=1, gradient_clipping=0.7),
        gradient_accumulation_steps=3,
        mixed_precision="bf16",
    )
    model, loader = objects(batch_size=5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    config = engine_config(accelerator)
    assert config["train_micro_batch_size_per_gpu"] == 5  # read from the loader of the same prepare() call
    assert config["gradient_accumulation_steps"] == 3
    assert config["train_batch_size"] == 15
    assert config["bf16"]["enabled"] is True and config["fp16"]["enabled"] is False
    assert config["gradient_clipping"] == 0.7
    assert model.bfloat16_enabled() and model.gradient_clipping() == 0.7


@pytest.mark.parametrize(
    "plugin_kwargs",
    [{"zero_stage": 2}, {"hf_ds_config": {"gradient_clipping": "auto"}}, {"hf_ds_config": {}}],
    ids=["fields", "auto", "absent"],
)
def test_no_clipping_unless_asked(plugin_kwargs):
    """DeepSpeed 0.19 clips at 1.0 when the config has no gradient_clipping; unasked, the engine must not clip:
    one SGD step on gradients of norm > 1 equals plain torch's step exactly."""
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(**plugin_kwargs))
    model, loader = objects()
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    x, y = next(iter(loader))
    y = y + 10.0  # a large loss: the gradient norm is far above DeepSpeed's default clip of 1.0
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    assert engine_config(accelerator)["gradient_clipping"] == 0.0 and model.gradient_clipping() == 0.0
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()

    torch.nn.functional.mse_loss(reference(x), y).backward()
    assert torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()]) > 10
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter -= 0.1 * parameter.grad
    assert torch.allclose(model.module.weight, reference.weight, rtol=0, atol=1e-6)
    assert torch.allclose(model.module.bias, reference.bias, rtol=0, atol=1e-6)


def test_config_accumulation_steps_reach_the_accelerator():
    accelerator = Accelerator(
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={"gradient_accumulation_steps": 4})
    )
    model, loader = objects()
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    assert accelerator.gradient_accumulation_steps == 4


@pytest.mark.parametrize(
    ("config", "accelerator_kwargs", "message"),
    [
        (
            {"gradient_accumulation_steps": 4},
            {"gradient_accumulation_steps": 2},
            "gradient_accumulation_steps.*says 4 but the Accelerator's is 2",
        ),
        (
            {"train_micro_batch_size_per_gpu": 8},
            {},
            "train_micro_batch_size_per_gpu is 8 but the prepared data loader yields 4",
        ),
        (
            {"bf16": {"enabled": True}},
            {"mixed_precision": "fp16"},
            "enables bf16 but the Accelerator's mixed_precision",
        ),
        (
            {"bf16": {"enabled": False}},
            {"mixed_precision": "bf16"},
            "mixed_precision is 'bf16' but .* bf16.enabled=false",
        ),
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}},
            {},
            'defines an "optimizer" but prepare\\(\\) got a SGD',
        ),
        (
            {"zero_optimization": {"stage": 2, "round_robin_gradients": "auto"}},
            {},
            "cannot fill: zero_optimization.round_robin_gradients",
        ),
    ],
)
def test_conflicting_explicit_values_are_errors_naming_both(config, accelerator_kwargs, message):
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config), **accelerator_kwargs)
    model, loader = objects()
    with pytest.raises(ConfigurationError, match=message):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)


def test_micro_batch_unknown_without_a_loader_is_an_error():
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=0))
    model, _ = objects()
    with pytest.raises(ConfigurationError, match="no data loader was prepared"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_dummy_optimizer_and_scheduler_fill_the_config():
    config = {
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
                "total_num_steps": "auto",
            },
        },
    }
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model, loader = objects()
    optimizer = DummyOptim(model.parameters(), lr=0.02, weight_decay=0.1)
    scheduler = DummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    filled = engine_config(accelerator)
    assert filled["optimizer"]["params"] == {"lr": 0.02, "weight_decay": 0.1, "torch_adam": True}
    assert filled["scheduler"]["params"] == {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": 0.02,
        "warmup_num_steps": 2,
        "total_num_steps": 10,
    }
    lrs = []
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    assert lrs[0] < lrs[1] == pytest.approx(0.02)  # warmed up over 2 steps, by the engine's scheduler


def test_dummy_optimizer_without_config_section_is_an_error():
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=1))
    model, loader = objects()
    with pytest.raises(ConfigurationError, match='DummyOptim was passed.*no "optimizer" section'):
        accelerator.prepare(model, DummyOptim(model.parameters()), loader)


def test_offload_with_a_torch_optimizer_trains():
    """DeepSpeed refuses a torch optimizer with optimizer offload unless zero_force_ds_cpu_optimizer is false;
    the backend sets it and the torch optimizer steps the CPU partitions."""
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu"))
    model, loader = objects()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    assert engine_config(accelerator)["zero_force_ds_cpu_optimizer"] is False
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    assert not torch.equal(model.module.weight.detach(), before)


def test_backend_config_from_the_launcher_environment(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", '{"zero_stage": 1, "gradient_clipping": 2.0}')
    accelerator = Accelerator(backend="deepspeed")
    model, loader = objects()
    model, _, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    assert model.zero_optimization_stage() == 1 and model.gradient_clipping() == 2.0


def test_zero3_init_creates_partitioned_parameters_that_train():
    from drivetrain.utils import zero3_init

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    with zero3_init(accelerator):
        model = torch.nn.Linear(3, 1)
    assert hasattr(model.weight, "ds_id")  # created already partitioned
    _, loader = objects()
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    before = model.full_state_dict()["weight"]
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    assert model.full_state_dict()["weight"].shape == (1, 3)
    assert not torch.equal(model.full_state_dict()["weight"], before)


def test_zero3_init_outside_stage_3_does_nothing():
    from drivetrain.utils import zero3_init

    with zero3_init(DeepSpeedPlugin(zero_stage=2)):
        model = torch.nn.Linear(3, 1)
    assert not hasattr(model.weight, "ds_id")


@pytest.mark.parametrize(
    ("plugin_kwargs", "accelerator_kwargs", "source"),
    [
        ({"zero_stage": 2}, {"mixed_precision": "fp16"}, "mixed_precision='fp16'"),
        ({"hf_ds_config": {"fp16": {"enabled": True}}}, {}, 'the DeepSpeed config\'s "fp16"'),
    ],
)
def test_fp16_where_deepspeed_refuses_it_is_a_clear_error(
    monkeypatch, plugin_kwargs, accelerator_kwargs, source
):
    """DeepSpeed's CPU accelerator supports fp16 only with oneDNN fp16 kernels (not on this machine's CPU);
    without them the error names the precision and the valid ones, not DeepSpeed's bare ValueError."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: False)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(**plugin_kwargs), **accelerator_kwargs)
    model, loader = objects()
    with pytest.raises(ConfigurationError) as raised:
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    message = str(raised.value)
    assert message.startswith(source)
    assert (
        "DeepSpeed does not support fp16 on this cpu device; valid mixed_precision here: 'no', 'bf16'"
        in message
    )


def test_fp16_on_this_cpu_matches_deepspeeds_own_verdict():
    """Unpatched: an fp16 run either trains (oneDNN fp16 present) or raises our error, never DeepSpeed's."""
    from deepspeed.accelerator import get_accelerator

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2), mixed_precision="fp16")
    model, loader = objects()
    if get_accelerator().is_fp16_supported():
        model, _, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
        assert model.fp16_enabled()
    else:
        with pytest.raises(ConfigurationError, match="mixed_precision='fp16' with the deepspeed backend"):
            accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
