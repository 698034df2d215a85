"""The mps plugin, without Apple hardware (none is available to this project): torch's availability check
(``torch.backends.mps.is_available``, and ``is_macos_or_newer``, which raises off macOS) is patched.

What these tests can establish here: which device a process gets (mps when present, the CPU when forced or
absent), the refusal of several processes, the precision checks, that forward passes would run under
``torch.autocast("mps", dtype)`` in the supported dtypes (torch sets up mps autocast state on any
platform), and that the plugin changes nothing on a machine without mps (the conformance suite with it
active). What they cannot: any computation on the mps device, ``PYTORCH_ENABLE_MPS_FALLBACK``, the fp16
GradScaler on mps, speed — docs/mps.md lists the plugin as not run on hardware.
"""

from __future__ import annotations

import types

import pytest
import torch
from drivetrain_mps import plugin as mps_plugin

from drivetrain import Accelerator
from drivetrain.plugin_api import ConfigurationError, PluginInfo
from drivetrain.plugin_api.state import PartialState
from drivetrain.plugin_api.tooling import get_plugin_registry

ON_A_MAC_WITH_MPS = torch.backends.mps.is_available()


@pytest.fixture
def fake_mps(monkeypatch):
    """torch says an mps device is there, on macOS 14 or later."""
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: True)


def test_the_plugin_is_a_device_plugin_listed_in_both_entry_point_groups():
    manager = get_plugin_registry()
    assert "mps" in manager.device_plugins()
    assert manager.info("mps").kind == "device"
    assert manager.distribution_of("mps") == "drivetrain-mps"


@pytest.mark.skipif(ON_A_MAC_WITH_MPS, reason="this machine has an mps device")
def test_without_mps_the_plugin_changes_nothing():
    assert mps_plugin.detect_device(cpu=False) is None
    assert PartialState().device == torch.device("cpu")


def test_mps_is_chosen_automatically_when_present(fake_mps):
    state = PartialState()
    assert state.device == torch.device("mps")
    assert "mps" in state.device_plugins and state.backend_name == "local"


def test_the_cpu_wins_when_forced(fake_mps, monkeypatch):
    assert PartialState(cpu=True).device == torch.device("cpu")
    from drivetrain.plugin_api.state import reset_state

    reset_state()
    monkeypatch.setenv("DRIVETRAIN_CPU", "1")  # `drivetrain launch --cpu`
    assert PartialState().device == torch.device("cpu")


def test_more_than_one_process_is_a_one_line_error(fake_mps, monkeypatch):
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as error:
        PartialState()
    message = str(error.value).splitlines()[0]  # the kernel adds a note naming the plugin and hook
    assert message.startswith("the mps device runs one process, but this script was started as 2 processes")
    assert "pass --cpu" in message


@pytest.mark.parametrize(("precision", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_forward_passes_autocast_on_mps_in_the_supported_dtypes(fake_mps, precision, dtype):
    accelerator = Accelerator(mixed_precision=precision, device_placement=False)
    assert accelerator.device == torch.device("mps")
    with accelerator.autocast():
        assert torch.is_autocast_enabled("mps") and torch.get_autocast_dtype("mps") == dtype
        assert not torch.is_autocast_enabled("cpu")
    model = accelerator.prepare(torch.nn.Linear(2, 2))  # device_placement=False: nothing runs on mps
    assert accelerator.unwrap_model(model) is model


def test_no_mixed_precision_means_no_autocast(fake_mps):
    accelerator = Accelerator(device_placement=False)
    with accelerator.autocast():
        assert not torch.is_autocast_enabled("mps")


def test_bf16_before_macos_14_is_a_one_line_error(fake_mps, monkeypatch):
    monkeypatch.setattr(
        torch.backends.mps, "is_macos_or_newer", lambda major, minor: (major, minor) < (14, 0)
    )
    accelerator = Accelerator(mixed_precision="bf16", device_placement=False)
    with pytest.raises(ConfigurationError, match=r"mixed_precision='bf16' on the mps device needs macOS 14"):
        accelerator.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigurationError, match="use mixed_precision='fp16'"):
        accelerator.autocast()


def test_a_precision_mps_cannot_run_is_a_one_line_error(fake_mps):
    """fp8 needs a precision plugin; with one installed (a stand-in here), the mps device still refuses it at
    prepare(), before any forward pass."""
    precision_plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="precision", precisions=("fp8",)))
    get_plugin_registry().register("stand-in-fp8", precision_plugin)
    accelerator = Accelerator(mixed_precision="fp8", device_placement=False)
    with pytest.raises(ConfigurationError) as error:
        accelerator.prepare(torch.nn.Linear(2, 2))
    message = str(error.value).splitlines()[0]
    assert message == (
        "mixed_precision='fp8' is not supported on the mps device (valid there: no, fp16, bf16); "
        "or pass cpu=True / --cpu"
    )


@pytest.mark.slow
def test_conformance_with_the_plugin_active_on_a_cpu_run(drivetrain_conformance):
    """Every property over `local` with the plugin named by every Accelerator: it must leave CPU runs (the
    suite forces cpu=True) exactly as the reference backend runs them."""
    drivetrain_conformance.check("local", processes=1, plugins=("mps",))
