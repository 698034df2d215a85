"""The Accelerator on one process: what a training script relies on."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Accelerator, GradientAccumulationPlugin
from drivetrain.errors import ConfigurationError
from drivetrain.training.optimizer import AcceleratedOptimizer
from drivetrain.training.scheduler import AcceleratedScheduler
from drivetrain.utils import set_seed

ROOT = Path(__file__).resolve().parents[2]


def _regression_data(n=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return TensorDataset(x, y)


def _train(accelerator, model, steps_data, lr=0.05, batch_size=8, epochs=2):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(steps_data, batch_size=batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    return accelerator.unwrap_model(model)


def _raw_train(model, data, lr=0.05, batch_size=8, epochs=2, accumulation=1):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(data, batch_size=batch_size)
    for _ in range(epochs):
        for index, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / accumulation
            loss.backward()
            if (index + 1) % accumulation == 0 or index + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad()
    return model


def test_prepare_returns_objects_in_order_and_wraps_optimizer_and_scheduler():
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = DataLoader(_regression_data(), batch_size=8)
    out = accelerator.prepare(loader, scheduler, "untouched", optimizer, model)
    assert out[4] is model
    assert isinstance(out[3], AcceleratedOptimizer) and out[3].optimizer is optimizer
    assert isinstance(out[1], AcceleratedScheduler) and out[1].scheduler is scheduler
    assert out[2] == "untouched"
    assert len(list(out[0])) == 4
    assert accelerator.prepare(model) is model  # single object comes back bare


def test_device_placement_list_must_match():
    with pytest.raises(ConfigurationError, match="device_placement has 1 entries but prepare\\(\\) got 2"):
        Accelerator().prepare(torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), device_placement=[True])


def test_training_matches_plain_pytorch_exactly():
    data = _regression_data()
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    trained = _train(Accelerator(), model, data)
    _raw_train(reference, data)
    for ours, theirs in zip(trained.parameters(), reference.parameters()):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("steps", [2, 3])
def test_gradient_accumulation_matches_raw_accumulation(steps):
    data = _regression_data(40)
    set_seed(1)
    model = torch.nn.Linear(4, 1)
    reference = copy.deepcopy(model)
    trained = _train(Accelerator(gradient_accumulation_steps=steps), model, data, batch_size=4, epochs=1)
    _raw_train(reference, data, batch_size=4, epochs=1, accumulation=steps)
    for ours, theirs in zip(trained.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_sync_gradients_follows_steps_and_end_of_dataloader():
    accelerator = Accelerator(gradient_accumulation_steps=3)
    model = torch.nn.Linear(4, 1)
    loader = accelerator.prepare(DataLoader(_regression_data(28), batch_size=4))  # 7 batches
    flags = []
    for _ in loader:
        with accelerator.accumulate(model):
            flags.append(accelerator.sync_gradients)
    assert flags == [False, False, True, False, False, True, True]


def test_sync_with_dataloader_false_ignores_the_end():
    plugin = GradientAccumulationPlugin(num_steps=3, sync_with_dataloader=False)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)
    loader = accelerator.prepare(DataLoader(_regression_data(28), batch_size=4))
    flags = []
    for _ in loader:
        with accelerator.accumulate():
            flags.append(accelerator.sync_gradients)
    assert flags == [False, False, True, False, False, True, False]


def test_accumulation_steps_in_both_places_is_an_error():
    with pytest.raises(ConfigurationError, match="not both"):
        Accelerator(
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )


def test_scheduler_steps_only_with_the_optimizer_and_adjusts_for_accumulation():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    model, optimizer, scheduler, loader = accelerator.prepare(
        model, optimizer, scheduler, DataLoader(_regression_data(16), batch_size=4)
    )
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    # 4 batches = 2 optimizer steps. As in Accelerate, Accelerator(gradient_accumulation_steps=2) keeps only
    # the plugin settings that differ from its defaults (plugin_kwargs == {"num_steps": 2}), so
    # `gradient_state.adjust_scheduler` reads False and the accumulation steps are not counted: 1 + 2 steps.
    assert accelerator.gradient_state.plugin_kwargs == {"num_steps": 2}
    assert scheduler.scheduler.last_epoch == 2
    assert scheduler.scheduler._step_count == 3


def test_seed_self_contained_gradient_accumulation_example_prints_documented_weights():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "gradient_accumulation.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.strip().splitlines()
    assert lines == [
        "initial model weight is 0.00000",
        "initial model weight is 0.00000",
        "0 tensor([1., 2.])",
        "1 tensor([3., 4.])",
        "2 tensor([5., 6.])",
        "3 tensor([7., 8.])",
        "w/ accumulation, the final model weight is 2.04000",
        "w/o accumulation, the final model weight is 2.04000",
    ]


def test_bf16_forward_runs_in_bf16_and_returns_fp32():
    accelerator = Accelerator(mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    seen = []
    # The inner layer computes in bf16; the prepared model's forward hands back fp32.
    model[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    out = model(torch.ones(2, 4))
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain(torch.ones(2, 4)).dtype == torch.float32 and seen[-1] == torch.float32


def test_fp16_uses_a_grad_scaler_and_skips_steps_on_overflow():
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    assert isinstance(accelerator.scaler, torch.amp.GradScaler)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    before = model.weight.detach().clone()
    loss = model(torch.ones(1, 4)).sum()
    accelerator.backward(loss * float("inf"))
    optimizer.step()
    assert accelerator.optimizer_step_was_skipped
    assert torch.equal(model.weight, before)
    optimizer.zero_grad()
    accelerator.backward(model(torch.ones(1, 4)).sum())
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped
    assert not torch.equal(model.weight, before)


def test_grad_scaler_kwargs_reach_torch():
    from drivetrain import GradScalerKwargs

    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    assert accelerator.scaler.get_scale() == 1024.0


def test_kwargs_handlers_pass_only_changed_fields():
    from drivetrain import AutocastKwargs, GradScalerKwargs

    assert GradScalerKwargs().to_kwargs() == {}
    assert GradScalerKwargs(growth_interval=10).to_kwargs() == {"growth_interval": 10}
    assert AutocastKwargs(cache_enabled=False).to_kwargs() == {"cache_enabled": False}
    with pytest.raises(ConfigurationError, match="GradScalerKwargs.init_scale must be > 0"):
        GradScalerKwargs(init_scale=-1)
    with pytest.raises(ConfigurationError, match="two GradScalerKwargs"):
        Accelerator(kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs()])
    with pytest.raises(ConfigurationError, match="KwargsHandler objects"):
        Accelerator(kwargs_handlers=[{"init_scale": 1}])


def test_config_objects_reject_bad_values_naming_the_field():
    from drivetrain import DataLoaderConfiguration, ProjectConfiguration, TorchDynamoPlugin
    from drivetrain.config.enums import DynamoBackend

    with pytest.raises(ConfigurationError, match="ProjectConfiguration.total_limit"):
        ProjectConfiguration(total_limit=0)
    with pytest.raises(ConfigurationError, match="DataLoaderConfiguration.even_batches"):
        DataLoaderConfiguration(even_batches="yes")
    with pytest.raises(ConfigurationError, match="TorchDynamoPlugin.backend='turbo'"):
        TorchDynamoPlugin(backend="turbo")
    with pytest.raises(ConfigurationError, match="TorchDynamoPlugin.mode='fastest'"):
        TorchDynamoPlugin(mode="fastest")
    # an assignment is checked and converted as the constructor's argument is
    project = ProjectConfiguration(project_dir=Path("/runs/a"), total_limit=2)
    assert project.project_dir == project.logging_dir == str(Path("/runs/a"))
    with pytest.raises(
        ConfigurationError, match="ProjectConfiguration.total_limit must be an integer >= 1, got 0"
    ):
        project.total_limit = 0
    assert project.total_limit == 2
    project.project_dir = Path("/runs/b")
    assert project.project_dir == str(Path("/runs/b"))
    dynamo = TorchDynamoPlugin()
    dynamo.backend = "inductor"
    assert dynamo.backend == DynamoBackend.INDUCTOR


def test_config_objects_are_dataclasses_as_in_accelerate():
    # scripts written for Accelerate use the dataclass functions on them
    import dataclasses

    from drivetrain import GradScalerKwargs, ProjectConfiguration

    project = dataclasses.replace(
        ProjectConfiguration(project_dir="/runs/a"), automatic_checkpoint_naming=True
    )
    assert (project.project_dir, project.automatic_checkpoint_naming) == ("/runs/a", True)
    assert dataclasses.asdict(GradScalerKwargs(init_scale=1024.0))["init_scale"] == 1024.0
    assert [field.name for field in dataclasses.fields(GradScalerKwargs)][:2] == [
        "init_scale",
        "growth_factor",
    ]
    with pytest.raises(ConfigurationError, match="GradScalerKwargs.growth_interval must be > 0"):
        dataclasses.replace(GradScalerKwargs(), growth_interval=0)


def test_clip_grad_value_and_unscale_under_fp16():
    accelerator = Accelerator(mixed_precision="fp16")
    model = torch.nn.Linear(2, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.full((1, 2), 100.0)).sum())
    accelerator.clip_grad_value_(model.parameters(), 0.5)
    # gradients were unscaled first, then clamped
    assert model.weight.grad.abs().max().item() == pytest.approx(0.5)


def test_unwrap_model_peels_torch_compile_on_request():
    accelerator = Accelerator(dynamo_backend="eager")
    model = torch.nn.Linear(2, 2)
    compiled = accelerator.prepare(model)
    assert hasattr(compiled, "_orig_mod")
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model
    assert accelerator.unwrap_model(compiled) is compiled
    torch.testing.assert_close(compiled(torch.ones(1, 2)), model(torch.ones(1, 2)))


def test_collectives_are_identities_on_one_process():
    accelerator = Accelerator()
    tensor = torch.arange(6).reshape(3, 2)
    assert torch.equal(accelerator.gather(tensor), tensor)
    assert torch.equal(accelerator.reduce(tensor.clone(), "sum"), tensor)
    assert torch.equal(accelerator.pad_across_processes(tensor), tensor)
    with accelerator.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]
    nested = {"a": tensor, "b": [tensor, (tensor,)]}
    gathered = accelerator.gather(nested)
    assert torch.equal(gathered["b"][1][0], tensor)


def test_triggers_and_process_decorators():
    accelerator = Accelerator()
    assert not accelerator.check_trigger()
    accelerator.set_trigger()
    assert accelerator.check_trigger()
    assert not accelerator.check_trigger()
    assert accelerator.on_main_process(lambda: 5)() == 5
    assert accelerator.on_process(lambda: 6, process_index=0)() == 6
    assert accelerator.on_process(lambda: 7, process_index=1)() is None
    with accelerator.main_process_first():
        pass
    accelerator.wait_for_everyone()


def test_find_executable_batch_size_halves_on_out_of_memory():
    from drivetrain import find_executable_batch_size

    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, offset):
        tried.append(batch_size)
        if batch_size > 16:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return batch_size + offset

    assert train(1) == 17
    assert tried == [128, 64, 32, 16]

    @find_executable_batch_size(starting_batch_size=4)
    def never(batch_size):
        raise RuntimeError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="reached zero"):
        never()

    @find_executable_batch_size(starting_batch_size=4)
    def other_error(batch_size):
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        other_error()


def test_free_memory_forgets_prepared_objects():
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert accelerator._models == [model]
    model = accelerator.free_memory(model)
    assert accelerator._models == [] and model == [None]


def test_state_reports_one_process():
    accelerator = Accelerator()
    assert accelerator.distributed_type == "NO"
    assert (accelerator.num_processes, accelerator.process_index, accelerator.local_process_index) == (
        1,
        0,
        0,
    )
    assert accelerator.is_main_process and accelerator.is_local_main_process and accelerator.is_last_process
    assert not accelerator.use_distributed
    assert accelerator.device == torch.device("cpu")


def test_project_configuration_directories():
    from drivetrain import ProjectConfiguration

    accelerator = Accelerator(project_dir="runs/x")
    assert accelerator.project_dir == "runs/x" and accelerator.logging_dir == "runs/x"
    config = ProjectConfiguration(
        project_dir="a", logging_dir="b", automatic_checkpoint_naming=True, total_limit=2
    )
    accelerator = Accelerator(project_config=config)
    assert accelerator.logging_dir == "b" and accelerator.save_iteration == 0


def test_gradient_accumulation_steps_from_environment(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS", "4")
    assert Accelerator().gradient_accumulation_steps == 4
    with pytest.raises(ConfigurationError, match="conflicting 'gradient_accumulation_steps'"):
        Accelerator(gradient_accumulation_steps=2)


def test_rng_types_are_validated():
    with pytest.raises(ConfigurationError, match="rng_types entry 'dice'"):
        Accelerator(rng_types=["dice"])


def test_requested_plugins_are_the_names_the_script_gave():
    import types

    from drivetrain.contract.info import PluginInfo
    from drivetrain.contract.registry import get_plugin_registry

    get_plugin_registry().register(
        "noop-feature", types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="feature"))
    )
    assert Accelerator().requested_plugins == ()
    accelerator = Accelerator(plugins=["noop-feature", "noop-feature"])
    assert accelerator.requested_plugins == ("noop-feature",)
    assert "noop-feature" in accelerator.state.plugins.names


def test_a_step_replaced_in_place_after_the_scheduler_is_tracked_again():
    """A plugin that swaps optimizer.step for a fused one (IPEX) after the user built a scheduler calls
    track_step_for_schedulers; scheduler.step() then does not warn that the step was overridden."""
    import types
    import warnings

    from drivetrain.plugin_api.training import track_step_for_schedulers

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    original = optimizer.step
    optimizer.step = types.MethodType(lambda self, closure=None: original(closure), optimizer)  # fused step
    track_step_for_schedulers(optimizer)
    track_step_for_schedulers(optimizer)  # once only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.5
