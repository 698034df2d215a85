"""One test per hook (named ``test_hook_<name>...``; tests/contract/test_contract.py checks every hook has one).

Each registers a small plugin in code and checks that the kernel calls the hook when and how
hookspecs.py says: first result, chain in composition order, or broadcast.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from drivetrain import hookimpl
from drivetrain.contract.environment import DistributedEnvironment
from drivetrain.contract.info import PluginInfo
from drivetrain.contract.registry import get_plugin_registry


def _plugin(kind: str, **hooks):
    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind=kind))
    for name, function in hooks.items():
        setattr(plugin, name, hookimpl(function))
    return plugin


def _toy_backend(**hooks):
    hooks.setdefault("setup_process_group", lambda: DistributedEnvironment())
    get_plugin_registry().register("toy", _plugin("backend", **hooks))


def test_hook_register_extensions_runs_once_at_load():
    calls = []

    class Tracker:
        name = "mine"

    def register_extensions(registry):
        calls.append(registry)
        registry.add_tracker("mine", Tracker)
        registry.add_command("hello", lambda parser: None, lambda args: 0, help="say hello")

    manager = get_plugin_registry()
    manager.register("ext", _plugin("extension", register_extensions=register_extensions))
    assert len(calls) == 1
    assert manager.extensions.trackers["mine"] == ("ext", Tracker)
    assert manager.extensions.commands["hello"][0] == "ext"


def test_hook_register_extensions_refuses_a_name_taken_by_another_plugin():
    from drivetrain.errors import PluginError

    manager = get_plugin_registry()
    manager.register(
        "a", _plugin("extension", register_extensions=lambda registry: registry.add_tracker("x", int))
    )
    with pytest.raises(PluginError, match="already registered by plugin 'a'"):
        manager.register(
            "b", _plugin("extension", register_extensions=lambda registry: registry.add_tracker("x", str))
        )


def test_hook_register_extensions_state_attribute_reaches_state_and_accelerator():
    """registry.add_state_attribute: Accelerate spellings a plugin owns, read through AcceleratorState (and
    the Accelerator when asked); only for names the kernel does not have."""
    from drivetrain import Accelerator

    def register_extensions(registry):
        registry.add_state_attribute("toy_setting", lambda state: ("toy", state.mixed_precision))
        registry.add_state_attribute("toy_everywhere", lambda state: state.num_processes, on_accelerator=True)
        registry.add_state_attribute("device", lambda state: "never used")  # the kernel's attribute wins

    get_plugin_registry().register("toy_names", _plugin("extension", register_extensions=register_extensions))
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    assert accelerator.state.toy_setting == ("toy", "bf16")
    assert accelerator.state.toy_everywhere == 1 and accelerator.toy_everywhere == 1
    assert accelerator.state.device == accelerator.device == torch.device("cpu")
    with pytest.raises(AttributeError, match="'Accelerator' object has no attribute 'toy_setting'"):
        accelerator.toy_setting  # noqa: B018 - registered for the state only
    with pytest.raises(AttributeError, match="no attribute 'not_registered'"):
        accelerator.state.not_registered  # noqa: B018
    assert not hasattr(accelerator, "_private_probe")


def test_hook_detect_device_device_plugin_answers_before_the_backend():
    seen = []

    def detect_device(local_process_index, cpu):
        seen.append((local_process_index, cpu))
        return torch.device("meta")

    get_plugin_registry().register("fake_device", _plugin("device", detect_device=detect_device))
    from drivetrain.state import PartialState

    state = PartialState(cpu=True)
    assert state.device == torch.device("meta")
    assert seen == [(0, True)]


def test_hook_detect_device_selects_the_backend_that_declares_the_device():
    """A device plugin's device picks the backend declaring it in ``select_for_devices`` when no backend was
    asked for (an XLA device needs the xla backend); a backend asked for by name keeps the choice."""
    from drivetrain import Accelerator

    seen = []

    def setup_process_group(device, backend_config):
        seen.append((device.type, backend_config))
        return DistributedEnvironment()

    manager = get_plugin_registry()
    manager.register(
        "fake_device", _plugin("device", detect_device=lambda cpu: None if cpu else torch.device("meta"))
    )
    backend = types.SimpleNamespace(
        PLUGIN_INFO=PluginInfo(kind="backend", select_for_devices=("meta",)),
        setup_process_group=hookimpl(setup_process_group),
    )
    manager.register("meta_backend", backend)
    accelerator = Accelerator()
    assert accelerator.backend == "meta_backend" and accelerator.device.type == "meta"
    assert accelerator.state.backend_source == "automatic (device meta)"
    assert seen == [("meta", None)]

    from drivetrain.state import reset_state

    reset_state()
    assert Accelerator(cpu=True).backend == "local"  # a CPU device: the automatic choice stays

    reset_state()

    class MetaConfig:
        backend_name = "meta_backend"

    config = MetaConfig()
    Accelerator(backend_config=config)
    assert seen[-1] == ("meta", config)  # setup_process_group receives the script's configuration object
    reset_state()
    assert Accelerator(backend="local").backend == "local"  # asked by name: kept


def test_hook_detect_device_local_picks_cpu_when_forced():
    from drivetrain.state import PartialState

    assert PartialState(cpu=True).device == torch.device("cpu")


def test_hook_setup_process_group_result_describes_the_process():
    _toy_backend(
        setup_process_group=lambda device, init_kwargs: DistributedEnvironment(
            num_processes=1, process_index=0, torch_backend=str(init_kwargs.get("backend"))
        )
    )
    from drivetrain import Accelerator, InitProcessGroupKwargs

    accelerator = Accelerator(backend="toy", kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    assert accelerator.state.backend == "gloo"
    assert accelerator.num_processes == 1 and accelerator.is_main_process


def test_hook_wrap_model_is_chained_features_before_backend():
    order = []

    class Wrapper(torch.nn.Module):
        def __init__(self, module, tag):
            super().__init__()
            self.module, self.tag = module, tag

        def forward(self, x):
            return self.module(x)

    def feature_wrap(model, evaluation_mode):
        order.append(("feature", type(model).__name__, evaluation_mode))
        return None  # converted in place

    def backend_wrap(model, accelerator):
        order.append(("backend", type(model).__name__, accelerator.backend))
        return Wrapper(model, "toy")

    get_plugin_registry().register("conv", _plugin("precision", wrap_model=feature_wrap))
    _toy_backend(wrap_model=backend_wrap)
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="toy", plugins=["conv"])
    model = torch.nn.Linear(2, 2)
    prepared = accelerator.prepare(model)
    assert order == [("feature", "Linear", False), ("backend", "Linear", "toy")]
    assert isinstance(prepared, Wrapper)
    assert accelerator.unwrap_model(prepared) is model


def test_hook_wrap_optimizer_can_replace_the_optimizer():
    replacement = {}

    def wrap_optimizer(optimizer, accelerator):
        new = torch.optim.SGD(optimizer.param_groups[0]["params"], lr=0.5)
        replacement["new"] = new
        return new

    _toy_backend(wrap_optimizer=wrap_optimizer)
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="toy")
    model = torch.nn.Linear(2, 2)
    _, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert optimizer.optimizer is replacement["new"]
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_hook_shard_dataloader_first_result_replaces_the_default():
    marker = object()
    _toy_backend(shard_dataloader=lambda dataloader, accelerator, device_placement: marker)
    from drivetrain import Accelerator

    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    assert Accelerator(backend="toy").prepare(loader) is marker


def test_hook_autocast_returns_the_context_used_by_accelerator_autocast():
    entered = []

    @contextlib.contextmanager
    def context():
        entered.append(True)
        yield

    _toy_backend(autocast=lambda accelerator, autocast_kwargs: context())
    from drivetrain import Accelerator

    with Accelerator(backend="toy").autocast():
        pass
    assert entered == [True]


def test_hook_autocast_local_gives_bf16_on_cpu():
    from drivetrain import Accelerator

    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    with accelerator.autocast():
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16


def test_hook_backward_receives_the_accumulation_scaled_loss():
    seen = []

    def backward(loss, backward_kwargs):
        seen.append((loss.item(), backward_kwargs))
        loss.backward()
        return True

    _toy_backend(backward=backward)
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="toy", gradient_accumulation_steps=4)
    weight = torch.nn.Parameter(torch.tensor(2.0))
    accelerator.backward(weight * 4, retain_graph=True)
    assert seen == [(2.0, {"retain_graph": True})]
    assert weight.grad.item() == 1.0


def test_hook_clip_grad_norm_result_is_returned():
    _toy_backend(clip_grad_norm=lambda parameters, max_norm, norm_type: torch.tensor(float(len(parameters))))
    from drivetrain import Accelerator

    model = torch.nn.Linear(2, 2)
    assert Accelerator(backend="toy").clip_grad_norm_(model.parameters(), 1.0).item() == 2.0


def test_hook_clip_grad_norm_local_clips_like_torch():
    from drivetrain import Accelerator

    model = torch.nn.Linear(3, 1)
    model.weight.grad = torch.full_like(model.weight, 3.0)
    model.bias.grad = torch.full_like(model.bias, 4.0)
    norm = Accelerator().clip_grad_norm_(model.parameters(), max_norm=1.0)
    assert norm.item() == pytest.approx((3 * 9 + 16) ** 0.5)
    total = torch.cat([model.weight.grad.flatten(), model.bias.grad.flatten()]).norm()
    assert total.item() == pytest.approx(1.0, rel=1e-4)


def test_hook_save_state_and_hook_load_state_are_called_with_prepared_objects(tmp_path):
    calls = []

    def save_state(output_dir, models, optimizers, schedulers, safe_serialization):
        calls.append(("save", len(models), len(optimizers), safe_serialization))
        torch.save(models[0].state_dict(), f"{output_dir}/toy.pt")
        return True

    def load_state(input_dir, models, map_location):
        calls.append(("load", len(models), map_location))
        models[0].load_state_dict(torch.load(f"{input_dir}/toy.pt", weights_only=True))
        return True

    _toy_backend(save_state=save_state, load_state=load_state)
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="toy")
    model = torch.nn.Linear(2, 2)
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    expected = model.weight.detach().clone()
    accelerator.save_state(str(tmp_path / "ckpt"))
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert torch.equal(model.weight, expected)
    assert calls[0] == ("save", 1, 1, True) and calls[1][:2] == ("load", 1)


def test_hook_dispatch_module_local_handles_a_single_device_map():
    local = get_plugin_registry().load("local").module
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert local.dispatch_module(model=model, device_map={"": "cpu"}, main_device="cpu") is model
    # An offloading map is not the reference backend's job: it declines.
    assert local.dispatch_module(model=model, device_map={"0": "cpu", "1": "disk"}, main_device="cpu") is None


def test_hook_dispatch_module_plugin_is_asked_by_dispatch_model(monkeypatch, tmp_path):
    from drivetrain import big_modeling

    monkeypatch.setenv("DRIVETRAIN_LOAD_PLUGINS", "placer")  # keep drivetrain-offload out of the way
    seen = []

    def dispatch_module(model, device_map, main_device):
        seen.append(device_map)
        return model

    get_plugin_registry().register("placer", _plugin("feature", dispatch_module=dispatch_module))
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    big_modeling.dispatch_model(model, device_map={"0": "cpu", "1": "disk"}, offload_dir=str(tmp_path))
    assert seen and seen[0]["1"] == "disk"


def test_hook_load_state_local_restores_model_optimizer_and_scheduler(tmp_path):
    from drivetrain import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.backward(model(torch.ones(1, 3)).sum())
    optimizer.step()
    scheduler.step()
    accelerator.save_state(str(tmp_path / "c"))
    saved_weight = model.weight.detach().clone()
    saved_moment = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    accelerator.backward(model(torch.ones(1, 3)).sum())
    optimizer.step()
    scheduler.step()
    accelerator.load_state(str(tmp_path / "c"))
    assert torch.equal(model.weight, saved_weight)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved_moment)
    assert scheduler.scheduler.last_epoch == 1


# -- contract 1.1: what reaches a hook as an argument instead of a private attribute ---------------------------
def test_hook_setup_process_group_receives_the_parallelism_config_and_reports_data_shards():
    from drivetrain import Accelerator
    from drivetrain.config.parallelism import ParallelismConfig

    received = []

    def setup_process_group(parallelism):
        received.append(parallelism)
        # Four processes in two tensor-parallel pairs: this process is in the second data share.
        return DistributedEnvironment(
            num_processes=4, process_index=2, data_parallel_size=2, data_parallel_rank=1
        )

    _toy_backend(setup_process_group=setup_process_group)
    config = ParallelismConfig(tp_size=2, dp_shard_size=2)
    accelerator = Accelerator(backend="toy", parallelism_config=config)
    assert received == [config]
    options = accelerator.sharding_options(device_placement=True)
    assert (options.num_processes, options.process_index) == (2, 1)
    # The reference backend shards by those coordinates: the second of two shares of 8 samples, batches of 2.
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(8), batch_size=2))
    assert [batch.tolist() for batch in loader] == [[2, 3], [6, 7]]


def test_hook_shard_dataloader_receives_the_sharding_options():
    seen = []

    def shard_dataloader(dataloader, options):
        seen.append(options)
        return None  # the reference backend shards

    _toy_backend(shard_dataloader=shard_dataloader)
    from drivetrain import Accelerator, DataLoaderConfiguration

    accelerator = Accelerator(backend="toy", dataloader_config=DataLoaderConfiguration(even_batches=False))
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(4)), batch_size=2))
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
    assert seen[0].even_batches is False and seen[0].device == accelerator.device
    assert seen[0].to_kwargs()["rng_types"] == ["generator"]


def test_hook_save_state_receives_weights_from_pre_hooks_and_save_kwargs(tmp_path):
    seen = {}

    def save_state(output_dir, weights, save_kwargs):
        seen.update(weights=[sorted(state) for state in weights], save_kwargs=save_kwargs)
        return None  # the reference backend writes the files

    _toy_backend(save_state=save_state)
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="toy")
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: weights[0].pop("bias"))
    accelerator.save_state(str(tmp_path / "ckpt"), blocking=True, exclude_frozen_parameters=True)
    assert seen == {"weights": [["weight"]], "save_kwargs": {"exclude_frozen_parameters": True}}
    from safetensors.torch import load_file

    assert sorted(load_file(str(tmp_path / "ckpt" / "model.safetensors"))) == ["weight"]
    assert model.bias is not None


def test_hook_load_state_receives_load_kwargs_and_waits_for_verification_only_when_asked(tmp_path):
    from drivetrain import Accelerator

    events = []

    def reads_then_verifies(input_dir, load_kwargs, verified):
        events.append(("called", dict(load_kwargs)))
        verified()
        events.append("verified")
        return None  # the reference backend restores the objects

    _toy_backend(load_state=reads_then_verifies)
    accelerator = Accelerator(backend="toy")
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    saved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    accelerator.load_state(folder, load_kwargs={"mmap": False})
    assert events == [("called", {"mmap": False}), "verified"]
    assert torch.equal(model.weight, saved)

    # A damaged file: the hook that calls verified() is told so, and nothing is applied.
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"garbage")
    from drivetrain.errors import CheckpointError

    before = model.weight.detach().clone()
    with pytest.raises(CheckpointError):
        accelerator.load_state(folder)
    assert torch.equal(model.weight, before)


def test_hook_wrap_optimizer_replacement_gets_the_users_scheduler():
    """A backend that returns another optimizer object: the scheduler the user built on the original is
    rebound to it, so the learning rate of the optimizer that steps changes."""

    def wrap_optimizer(optimizer):
        return torch.optim.SGD(optimizer.param_groups[0]["params"], lr=optimizer.param_groups[0]["lr"])

    _toy_backend(wrap_optimizer=wrap_optimizer)
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="toy")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for _ in range(2):
        accelerator.backward(model(torch.ones(1, 2)).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    assert optimizer.optimizer.param_groups[0]["lr"] == pytest.approx(0.25)


def test_hook_implementations_may_not_reorder_themselves():
    from drivetrain.errors import PluginError

    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="feature"))
    plugin.wrap_model = hookimpl(tryfirst=True)(lambda model: None)
    with pytest.raises(PluginError, match="tryfirst=True.*order of plugins follows their kind"):
        get_plugin_registry().register("eager", plugin)


def test_hook_styles_come_from_the_specs():
    from drivetrain.contract.hookspecs import HOOK_STYLES

    assert HOOK_STYLES["wrap_model"] == ("chain", "model")
    assert HOOK_STYLES["wrap_optimizer"] == ("chain", "optimizer")
    assert HOOK_STYLES["register_extensions"] == ("broadcast", None)
    assert {hook for hook, (style, _) in HOOK_STYLES.items() if style == "first"} == {
        "detect_device",
        "setup_process_group",
        "shard_dataloader",
        "autocast",
        "backward",
        "clip_grad_norm",
        "save_state",
        "load_state",
        "dispatch_module",
    }
