"""Backend selection and setting precedence: script > environment > config file > default, and a conflict
between two sources is an error naming both."""

from __future__ import annotations

import types

import attrs
import pytest

from drivetrain import hookimpl
from drivetrain.contract.environment import DistributedEnvironment
from drivetrain.contract.info import PluginInfo
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.errors import ConfigurationError, PluginError
from drivetrain.state import AcceleratorState, PartialState, reset_state


@attrs.define
class ToyConfig:
    backend_name = "toy"
    level: int = 1


def _register_toy_backend():
    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="backend"))

    @hookimpl
    def setup_process_group():
        return DistributedEnvironment()

    plugin.setup_process_group = setup_process_group
    get_plugin_registry().register("toy", plugin)


def test_default_is_local():
    from drivetrain import Accelerator

    assert Accelerator().backend == "local"


def test_backend_plugin_is_the_plugin_name_and_backend_its_alias():
    from drivetrain import Accelerator

    accelerator = Accelerator(cpu=True)
    # the plugin's name, not torch's process-group backend (one process: none, as in Accelerate)
    assert accelerator.backend_plugin == accelerator.backend == "local"
    assert accelerator.state.backend is None


def test_backend_argument_selects_the_plugin():
    _register_toy_backend()
    from drivetrain import Accelerator

    assert Accelerator(backend="toy").backend == "toy"


def test_backend_config_object_implies_its_backend():
    _register_toy_backend()
    from drivetrain import Accelerator

    accelerator = Accelerator(backend_config=ToyConfig(level=3))
    assert accelerator.backend == "toy"
    assert accelerator.state.backend_config.level == 3


def test_accelerate_style_alias_is_the_same_as_backend_config():
    _register_toy_backend()
    from drivetrain import Accelerator

    assert Accelerator(fsdp_plugin=ToyConfig()).backend == "toy"


def test_environment_selects_when_the_script_is_silent(monkeypatch):
    _register_toy_backend()
    monkeypatch.setenv("DRIVETRAIN_BACKEND", "toy")
    assert PartialState().backend_name == "toy"


def test_config_file_selects_when_script_and_environment_are_silent(monkeypatch, tmp_path):
    _register_toy_backend()
    config = tmp_path / "drivetrain.yaml"
    config.write_text("backend: toy\nmixed_precision: bf16\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(config))
    state = AcceleratorState()
    assert state.backend_name == "toy" and state.mixed_precision == "bf16"


def test_script_and_environment_disagreeing_is_an_error_naming_both(monkeypatch):
    _register_toy_backend()
    monkeypatch.setenv("DRIVETRAIN_BACKEND", "local")
    from drivetrain import Accelerator

    with pytest.raises(ConfigurationError) as info:
        Accelerator(backend="toy")
    assert "Accelerator(backend='toy')" in str(info.value) and "DRIVETRAIN_BACKEND=local" in str(info.value)


def test_environment_and_config_file_disagreeing_is_an_error(monkeypatch, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("mixed_precision: fp16\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(config))
    monkeypatch.setenv("DRIVETRAIN_MIXED_PRECISION", "bf16")
    with pytest.raises(ConfigurationError) as info:
        AcceleratorState()
    assert "DRIVETRAIN_MIXED_PRECISION=bf16" in str(info.value) and str(config) in str(info.value)


def test_backend_argument_contradicting_config_object_is_an_error():
    _register_toy_backend()
    from drivetrain import Accelerator

    with pytest.raises(ConfigurationError, match="belongs to backend 'toy'"):
        Accelerator(backend="local", backend_config=ToyConfig())


def test_two_backend_configs_are_an_error():
    from drivetrain import Accelerator

    with pytest.raises(
        ConfigurationError, match="fsdp_plugin, deepspeed_plugin|deepspeed_plugin, fsdp_plugin"
    ):
        Accelerator(fsdp_plugin=ToyConfig(), deepspeed_plugin=ToyConfig())


def test_unknown_backend_lists_installed():
    from drivetrain import Accelerator

    with pytest.raises(PluginError, match="installed: .*local"):
        Accelerator(backend="nope")


def test_feature_plugin_cannot_be_a_backend():
    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="feature"))
    get_plugin_registry().register("feat", plugin)
    with pytest.raises(PluginError, match="not a distribution backend"):
        PartialState(backend="feat")


def test_invalid_mixed_precision_names_valid_values():
    from drivetrain import Accelerator

    with pytest.raises(ConfigurationError, match="choose one of: no, fp8, fp16, bf16"):
        Accelerator(mixed_precision="fp12")


def test_fp8_without_a_precision_plugin_says_what_to_install(monkeypatch):
    from drivetrain import Accelerator

    monkeypatch.setenv("DRIVETRAIN_LOAD_PLUGINS", "local")  # as if drivetrain-fp8 were not installed
    with pytest.raises(PluginError, match="pip install drivetrain-fp8"):
        Accelerator(mixed_precision="fp8")


def test_local_refuses_several_processes_with_a_fix(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="pick a multi-process backend with `--backend NAME`"):
        PartialState(backend="local")


def test_second_accelerator_with_other_settings_works():
    from drivetrain import Accelerator

    first = Accelerator(mixed_precision="bf16")
    assert first.mixed_precision == "bf16"
    second = Accelerator(mixed_precision="no", gradient_accumulation_steps=3)
    assert second.mixed_precision == "no" and second.gradient_accumulation_steps == 3


def test_second_accelerator_with_another_backend_fails_clearly_then_works_after_reset():
    _register_toy_backend()
    from drivetrain import Accelerator

    Accelerator()
    with pytest.raises(ConfigurationError, match="reset_state"):
        Accelerator(backend="toy")
    reset_state()
    assert Accelerator(backend="toy").backend == "toy"


def test_bad_config_file_is_named(monkeypatch, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("- just\n- a list\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(config))
    with pytest.raises(ConfigurationError, match="bad.yaml"):
        PartialState()


def test_a_plugins_kwargs_handler_without_its_plugin_is_an_error_saying_how_to_run_it():
    pytest.importorskip("drivetrain_fp8")
    from drivetrain import Accelerator
    from drivetrain.utils import AORecipeKwargs

    with pytest.raises(
        ConfigurationError, match=r"AORecipeKwargs configures plugin 'fp8'.*mixed_precision='fp8'"
    ):
        Accelerator(cpu=True, kwargs_handlers=[AORecipeKwargs()])
