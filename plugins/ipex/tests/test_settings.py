"""The ipex plugin without IPEX: how a run asks for it, that installing it changes nothing, the XPU and
process-group decisions (with torch's XPU checks patched: no XPU exists here), and the one-line errors."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
import torch
from drivetrain_ipex import optimize, settings, xpu
from drivetrain_ipex import plugin as ipex_plugin

from drivetrain import Accelerator, InitProcessGroupKwargs
from drivetrain.plugin_api import ConfigurationError, PluginError
from drivetrain.plugin_api.state import PartialState
from drivetrain.plugin_api.tooling import get_plugin_registry


def _launched_options(monkeypatch, options: dict) -> None:
    """What `drivetrain launch` hands the processes for this plugin."""
    monkeypatch.setenv("DRIVETRAIN_PLUGIN_OPTIONS", json.dumps({"ipex": options}))


def test_the_plugin_is_a_device_plugin_listed_in_both_entry_point_groups():
    manager = get_plugin_registry()
    assert "ipex" in manager.device_plugins()
    assert manager.info("ipex").kind == "device"
    assert manager.distribution_of("ipex") == "drivetrain-ipex"
    assert PartialState().device_plugins.count("ipex") == 1


def test_nothing_asks_for_ipex_by_default():
    accelerator = Accelerator()
    request = settings.request(accelerator)
    assert request == settings.Request()
    assert not optimize.wants_ipex(request)


def test_installed_but_not_asked_changes_nothing():
    """Training with the plugin installed and not asked for equals plain torch bit for bit, and neither the
    model nor the optimizer is touched (no IPEX attributes, same classes)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    accelerator = Accelerator()
    prepared, prepared_optimizer = accelerator.prepare(model, optimizer)
    assert prepared is model and prepared_optimizer.optimizer is optimizer
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(3):
        accelerator.backward(torch.nn.functional.mse_loss(prepared(x), y))
        prepared_optimizer.step()
        prepared_optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(mine, theirs)
    assert not hasattr(model, "params_attr") and not hasattr(optimizer, "params_attr")
    assert type(model[0]) is torch.nn.Linear


def test_the_script_asks_with_accelerator_plugins():
    accelerator = Accelerator(plugins=["ipex"])
    assert accelerator.requested_plugins == ("ipex",)
    request = settings.request(accelerator)
    assert request.optimize and not request.use_xpu
    assert request.source == "Accelerator(plugins=['ipex'])"


@pytest.mark.parametrize(
    ("options", "source", "use_xpu"),
    [
        ({"ipex": True}, "drivetrain launch --ipex", False),
        ({"ipex_config": {"ipex": True}}, "config file ipex_config: ipex: true", False),
        ({"ipex": True, "use_xpu": True}, "drivetrain launch --ipex", True),
    ],
)
def test_launch_flags_and_config_keys_ask_for_ipex(monkeypatch, options, source, use_xpu):
    _launched_options(monkeypatch, options)
    request = settings.process_request()
    assert (request.optimize, request.use_xpu, request.source) == (True, use_xpu, source)


def test_use_xpu_alone_optimises_only_when_ipex_is_installed(monkeypatch):
    _launched_options(monkeypatch, {"use_xpu": True})
    request = settings.process_request()
    assert request.use_xpu and not request.optimize
    monkeypatch.setattr(optimize, "ipex_installed", lambda: False)
    assert not optimize.wants_ipex(request)
    monkeypatch.setattr(optimize, "ipex_installed", lambda: True)
    assert optimize.wants_ipex(request)


def test_the_launcher_hands_flags_and_accelerate_config_to_the_plugin(tmp_path):
    """The real launcher's resolution: --ipex / --use_xpu and Accelerate's `ipex_config` section reach the
    processes as this plugin's options (DRIVETRAIN_PLUGIN_OPTIONS)."""
    from drivetrain.commands.launch import environment_for, parse_arguments, resolve_plan

    config = tmp_path / "accelerate.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nipex_config:\n  ipex: true\n"
        "mixed_precision: bf16\nnum_processes: 1\nuse_cpu: true\n"
    )
    plan = resolve_plan(parse_arguments(["--config_file", str(config), "train.py"]), environ={})
    handed = json.loads(environment_for(plan)["DRIVETRAIN_PLUGIN_OPTIONS"])
    assert handed == {"ipex": {"ipex_config": {"ipex": True}}}
    plan = resolve_plan(parse_arguments(["--ipex", "--use_xpu", "train.py"]), environ={})
    assert json.loads(environment_for(plan)["DRIVETRAIN_PLUGIN_OPTIONS"]) == {
        "ipex": {"ipex": True, "use_xpu": True}
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"ipex": "maybe"},
            "ipex: 'maybe' is not a boolean; use one of y, yes, t, true, on, 1 (true) or n, no, f, false, off, 0 (false)",
        ),
        ({"ipx": True}, "unknown key 'ipx' (valid keys: ipex, use_xpu)"),
        ("yes", "expected a mapping with the keys ipex, use_xpu"),
    ],
)
def test_a_bad_ipex_config_section_is_one_line_naming_the_key(tmp_path, value, message):
    import yaml

    from drivetrain.commands.launch import parse_arguments, resolve_plan
    from drivetrain.plugin_api import DrivetrainError

    config = tmp_path / "drivetrain.yaml"
    config.write_text(yaml.safe_dump({"ipex_config": value}))
    with pytest.raises(DrivetrainError) as error:
        resolve_plan(parse_arguments(["--config_file", str(config), "train.py"]), environ={})
    assert f"ipex_config: {value!r} is not valid ({message})" in str(error.value)
    assert "\n" not in str(error.value)


def test_asked_without_ipex_installed_is_one_line_with_the_install_command(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(optimize.metadata, "version", not_installed)
    model = torch.nn.Linear(2, 2)
    accelerator = Accelerator(plugins=["ipex"])
    with pytest.raises(PluginError) as error:
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    message = str(error.value)
    assert message.startswith("Accelerator(plugins=['ipex']) asks for ipex.optimize, but")
    assert "intel-extension-for-pytorch is not installed: pip install 'drivetrain-ipex[ipex]'" in message
    assert "\n" not in message


def test_ipex_for_another_torch_is_refused_before_importing_it(monkeypatch):
    """IPEX crashes at import under a torch of another minor version; the plugin says why instead."""
    monkeypatch.setattr(optimize.metadata, "version", lambda name: "2.3.0")
    with pytest.raises(
        PluginError, match=r"intel-extension-for-pytorch 2\.3\.0 works only with torch 2\.3\.\*"
    ):
        optimize.load_ipex(settings.Request(optimize=True, source="drivetrain launch --ipex"))


def test_one_optimizer_per_model():
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    mine = torch.optim.SGD(first.parameters(), lr=0.1)
    other = torch.optim.SGD(second.parameters(), lr=0.1)
    assert optimize.optimizer_for(first, [other, mine]) is mine
    assert optimize.optimizer_for(first, [other]) is None
    shared = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    with pytest.raises(ConfigurationError, match="holds parameters of Linear and of other modules"):
        optimize.optimizer_for(first, [shared])
    split = [torch.optim.SGD([first.weight], lr=0.1), torch.optim.SGD([first.bias], lr=0.1)]
    with pytest.raises(ConfigurationError, match="2 optimizers hold parameters of one Linear"):
        optimize.optimizer_for(first, split)


# -- Intel XPU and process groups (no XPU here: torch's checks are patched) ----------------------------------
def test_detect_device_answers_xpu_when_torch_sees_one(monkeypatch):
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)
    assert ipex_plugin.detect_device(local_process_index=3, cpu=False) == torch.device("xpu", 1)
    assert ipex_plugin.detect_device(local_process_index=0, cpu=True) is None


def test_detect_device_leaves_the_cpu_alone_without_an_xpu():
    assert not xpu.xpu_available()  # this machine
    assert ipex_plugin.detect_device(local_process_index=0, cpu=False) is None
    assert PartialState().device == torch.device("cpu")


def test_use_xpu_without_an_xpu_is_one_line(monkeypatch):
    _launched_options(monkeypatch, {"use_xpu": True})
    with pytest.raises(ConfigurationError) as error:
        PartialState()
    message = str(error.value)
    assert message.startswith(
        "use_xpu (drivetrain launch --use_xpu or the config file): no Intel XPU is visible"
    )
    assert "\n" not in message


def test_use_xpu_with_cpu_is_a_conflict(monkeypatch):
    _launched_options(monkeypatch, {"use_xpu": True})
    with pytest.raises(ConfigurationError, match="asks for the Intel XPU, but cpu=True"):
        PartialState(cpu=True)


def test_ccl_needs_the_oneccl_bindings():
    """InitProcessGroupKwargs(backend='ccl') without oneccl_bind_pt (not on PyPI; not installed here)."""
    with pytest.raises(ConfigurationError) as error:
        Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="ccl")])
    message = str(error.value)
    assert "InitProcessGroupKwargs(backend='ccl') needs oneCCL's torch bindings" in message
    assert "pip install oneccl_bind_pt --extra-index-url" in message


def test_several_xpu_processes_need_xccl(monkeypatch):
    monkeypatch.setattr(xpu, "xccl_available", lambda: False)
    with pytest.raises(ConfigurationError, match="2 processes on Intel XPUs need torch's xccl"):
        xpu.check_process_group(torch.device("xpu", 0), {}, world_size=2)
    monkeypatch.setattr(xpu, "xccl_available", lambda: True)
    xpu.check_process_group(torch.device("xpu", 0), {}, world_size=2)  # the ddp backend picks xccl
    xpu.check_process_group(torch.device("cpu"), {}, world_size=2)  # gloo: nothing to check


def test_a_launched_flag_reaches_the_accelerator(monkeypatch):
    _launched_options(monkeypatch, {"ipex": True})
    request = settings.request(Accelerator())
    assert request.optimize and request.source == "drivetrain launch --ipex"
