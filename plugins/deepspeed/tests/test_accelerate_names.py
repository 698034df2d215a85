"""Accelerate's spellings for the DeepSpeed plugins (seed 002, "Using multiple models with DeepSpeed"):
``accelerator.deepspeed_plugin``, ``accelerator.state.deepspeed_plugin(s)``,
``accelerator.state.select_deepspeed_plugin(name)`` and ``get_deepspeed_plugin(name)``, registered by the
plugin through ``registry.add_state_attribute`` (the kernel knows none of these names)."""

from __future__ import annotations

import pytest
import torch
from drivetrain_deepspeed import DeepSpeedPlugin, get_active_deepspeed_plugin

from drivetrain import Accelerator
from drivetrain.errors import ConfigurationError
from drivetrain.state import AcceleratorState


def test_several_plugins_selected_through_the_state(one_process):
    plugins = {
        "student": DeepSpeedPlugin(zero_stage=2),
        "teacher": DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}}),
    }
    accelerator = Accelerator(deepspeed_plugins=plugins)
    active = get_active_deepspeed_plugin(accelerator.state)
    assert active is plugins["student"]
    assert accelerator.deepspeed_plugin is active and accelerator.state.deepspeed_plugin is active
    assert accelerator.state.deepspeed_plugins == plugins
    assert accelerator.state.get_deepspeed_plugin("teacher") is plugins["teacher"]

    accelerator.state.select_deepspeed_plugin("teacher")
    assert accelerator.deepspeed_plugin is plugins["teacher"]
    assert plugins["teacher"].selected and not plugins["student"].selected
    torch.manual_seed(0)
    teacher = accelerator.prepare(torch.nn.Linear(3, 1))
    assert teacher.zero_optimization_stage() == 3  # the next prepare() used the selected plugin

    AcceleratorState().select_deepspeed_plugin("student")  # the state is shared: any instance selects
    assert accelerator.deepspeed_plugin is plugins["student"]
    with pytest.raises(ConfigurationError, match="no DeepSpeed plugin named 'critic'.*'student', 'teacher'"):
        accelerator.state.select_deepspeed_plugin("critic")
    with pytest.raises(ConfigurationError, match="no DeepSpeed plugin named 'critic'"):
        accelerator.state.get_deepspeed_plugin("critic")


def test_one_plugin_is_both_the_active_one_and_deepspeed_plugins(one_process):
    plugin = DeepSpeedPlugin(zero_stage=1)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    assert accelerator.deepspeed_plugin is plugin
    assert accelerator.state.deepspeed_plugins is plugin  # Accelerate stores the one plugin it was given
    assert (
        "optimizer" not in accelerator.state.deepspeed_plugin.deepspeed_config
    )  # the seed's DummyOptim test
    with pytest.raises(ConfigurationError, match="needs several plugins"):
        accelerator.state.select_deepspeed_plugin("default")


def test_another_backend_answers_none_as_accelerate():
    accelerator = Accelerator(cpu=True)
    assert accelerator.state.backend_name != "deepspeed"
    assert accelerator.deepspeed_plugin is None
    assert accelerator.state.deepspeed_plugin is None and accelerator.state.deepspeed_plugins is None
    with pytest.raises(ConfigurationError, match="uses backend 'local', not 'deepspeed'"):
        accelerator.state.select_deepspeed_plugin("teacher")
    with pytest.raises(AttributeError, match="'Accelerator' object has no attribute 'deepspeed_plugins'"):
        accelerator.deepspeed_plugins  # noqa: B018 - Accelerate has it on the state only


#: What Accelerate's ``accelerate.utils`` exports from its ``utils/deepspeed.py`` (and the plugin class).
ACCELERATE_DEEPSPEED_UTILS = (
    "DeepSpeedPlugin",
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
)


def test_accelerate_utils_deepspeed_names_import_from_drivetrain_utils():
    """`from accelerate.utils import X` becomes `from drivetrain.utils import X`: the plugin provides each name
    through its drivetrain.exports entry points, and the kernel knows which distribution to suggest when the
    plugin is missing."""
    import drivetrain_deepspeed

    import drivetrain.utils
    from drivetrain.compat.install_hints import PLUGIN_EXPORTS

    for name in ACCELERATE_DEEPSPEED_UTILS:
        assert getattr(drivetrain.utils, name) is getattr(drivetrain_deepspeed, name), name
        assert PLUGIN_EXPORTS[name] == "drivetrain-deepspeed", name
