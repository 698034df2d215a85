"""Discovery, lazy loading, validation, restriction and tracing of plugins."""

from __future__ import annotations

import re
import subprocess
import sys
import types

import pytest

from drivetrain import hookimpl
from drivetrain.contract.exports import resolve_export
from drivetrain.contract.info import PluginInfo
from drivetrain.contract.registry import get_plugin_registry, validate_plugin
from drivetrain.errors import PluginError


def _run_python(code: str, **env: str) -> str:
    import os

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, check=True
    )
    return result.stdout.strip()


def test_import_drivetrain_imports_no_plugin_and_no_backend_library():
    # (modules Python's start-up imported before drivetrain, e.g. drivetrain-accelerate's .pth hook, do not count)
    loaded = _run_python(
        "import sys; started = set(sys.modules); import drivetrain; "
        "print(sorted(m for m in set(sys.modules) - started if m.startswith(('drivetrain_', 'deepspeed', "
        "'torch_xla', 'megatron', 'transformer_engine', 'torchao', 'intel_extension')) "
        "or m == 'drivetrain.backends.local'))"
    )
    assert loaded == "[]"


def test_import_drivetrain_does_not_import_torch_distributed_backends_eagerly():
    # The kernel's top-level import must stay cheap: no Accelerator, no plugin discovery.
    loaded = _run_python(
        "import sys, drivetrain; print('drivetrain.accelerator' in sys.modules, "
        "'drivetrain.plugins' in sys.modules)"
    )
    assert loaded == "False False"


def test_local_is_discovered_through_its_entry_point():
    manager = get_plugin_registry()
    record = manager.discovered()["local"]
    assert record.distribution == "drivetrain"
    assert record.value == "drivetrain.backends.local"
    assert not record.loaded
    assert "setup_process_group" in manager.hooks_of("local")
    assert manager.info("local").kind == "backend"


def test_load_plugins_env_restricts_discovery_but_keeps_local(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_LOAD_PLUGINS", "nonexistent")
    assert get_plugin_registry().names() == ["local"]


def test_unknown_plugin_lists_installed_ones_and_the_pip_command():
    with pytest.raises(PluginError) as info:
        get_plugin_registry().load("fsdpp")
    message = str(info.value)
    assert "'fsdpp'" in message and "local" in message and "pip install drivetrain-fsdpp" in message


def test_misspelled_hook_is_rejected_naming_plugin_hook_and_suggestion():
    plugin = types.SimpleNamespace()

    @hookimpl
    def wrap_modle(model):
        return model

    plugin.wrap_modle = wrap_modle
    with pytest.raises(PluginError) as info:
        validate_plugin("mine", plugin)
    assert "plugin 'mine'" in str(info.value)
    assert "'wrap_modle'" in str(info.value) and "did you mean 'wrap_model'" in str(info.value)


def test_wrong_argument_name_is_rejected_naming_the_argument():
    plugin = types.SimpleNamespace()

    @hookimpl
    def wrap_model(model, acelerator):
        return model

    plugin.wrap_model = wrap_model
    with pytest.raises(PluginError) as info:
        get_plugin_registry().register("typo", plugin)
    message = str(info.value)
    assert "plugin 'typo'" in message and "hook 'wrap_model'" in message and "'acelerator'" in message
    assert "did you mean 'accelerator'" in message


def test_contract_major_version_mismatch_is_a_clear_error():
    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="backend", contract="2.0"))
    with pytest.raises(PluginError, match="implements contract 2.0"):
        validate_plugin("future", plugin)


def test_plugin_kind_is_validated_when_declared():
    with pytest.raises(ValueError, match="kind"):
        PluginInfo(kind="distribution")


def test_exception_in_a_hook_keeps_its_type_and_names_the_plugin():
    from drivetrain import Accelerator

    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="feature"))

    @hookimpl
    def wrap_model(model):
        raise MemoryError("boom")

    plugin.wrap_model = wrap_model
    get_plugin_registry().register("broken", plugin)
    accelerator = Accelerator(plugins=["broken"])
    import torch

    with pytest.raises(MemoryError) as info:
        accelerator.prepare(torch.nn.Linear(2, 2))
    assert any("plugin 'broken'" in note and "wrap_model" in note for note in info.value.__notes__)


def test_trace_logs_every_hook_call_with_plugin_and_time(tmp_path):
    script = tmp_path / "traced.py"
    script.write_text(
        "import torch\nfrom drivetrain import Accelerator\n"
        "a = Accelerator()\nm = a.prepare(torch.nn.Linear(2, 1))\n"
        "a.backward(m(torch.ones(1, 2)).sum())\n"
    )
    import os

    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "DRIVETRAIN_TRACE_PLUGINS": "1"},
        check=True,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("[drivetrain trace]")]
    hooks = {line.split()[3] for line in lines}
    assert {"detect_device", "setup_process_group", "wrap_model", "backward"} <= hooks
    assert all(line.endswith("ms)") for line in lines)
    # Installed device plugins are active too: a first-result hook lists them before local on one line, a
    # chain traces each plugin's link on a line of its own. local takes part in every hook traced.
    for hook in hooks:
        assert any(
            line.split()[3] == hook and re.search(r"-> plugin (.+, )?local \(", line) for line in lines
        )


def test_plugin_provided_name_without_its_plugin_names_the_distribution(monkeypatch):
    import importlib.metadata

    installed = importlib.metadata.entry_points
    missing = ("MegatronLMPlugin", "FP8RecipeKwargs")  # as if drivetrain-megatron and drivetrain-fp8 were not
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kwargs: [entry for entry in installed(**kwargs) if entry.name not in missing],
    )
    with pytest.raises(ImportError, match="pip install drivetrain-megatron"):
        resolve_export("MegatronLMPlugin")
    with pytest.raises(ImportError, match="pip install drivetrain-fp8"):
        resolve_export("FP8RecipeKwargs")


def test_plugin_provided_name_resolves_through_exports_entry_points():
    pytest.importorskip("drivetrain_ddp")
    from drivetrain import DistributedDataParallelKwargs
    from drivetrain.utils import DistributedDataParallelKwargs as same

    assert DistributedDataParallelKwargs is same
    assert DistributedDataParallelKwargs.__module__.startswith("drivetrain_ddp")


def test_unknown_attribute_is_an_attribute_error():
    import drivetrain

    with pytest.raises(AttributeError):
        drivetrain.NotAThing  # noqa: B018


def test_a_contract_1_0_import_path_still_works_and_names_its_new_place():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    from drivetrain.plugins import PluginInfo\n"
        "except DeprecationWarning as w:\n"
        "    print('WARNED', w)\n"
        "warnings.simplefilter('ignore')\n"
        "from drivetrain.plugins import PluginInfo\n"
        "from drivetrain.plugin_api import PluginInfo as Current\n"
        "print('SAME', PluginInfo is Current)\n"
    )
    out = _run_python(code)
    assert "WARNED drivetrain.plugins moved to drivetrain.plugin_api" in out and "SAME True" in out


def test_a_removed_plugin_info_field_is_a_clear_error(tmp_path):
    from drivetrain.testing import install_plugin_for_test

    env = install_plugin_for_test(
        tmp_path,
        "old",
        "from drivetrain.plugin_api import PluginInfo\nPLUGIN_INFO = PluginInfo(kind='backend', config_class=dict)\n",
        distribution="old-plugin",
    )
    out = _run_python("from drivetrain.commands.main import main; main(['plugins'])", **env)
    line = next(line for line in out.splitlines() if line.startswith("old "))
    assert "BROKEN" in line and "(distribution old-plugin 0.1)" in line
    assert "'config_class' was removed in contract 1.1: delete it" in line


def test_accelerator_on_one_process_imports_no_other_plugin_module_and_no_service_it_does_not_use():
    loaded = _run_python(
        "import sys\n"
        "started = set(sys.modules)  # Python's start-up (drivetrain-accelerate's .pth hook) does not count\n"
        "import torch\n"
        "from drivetrain import Accelerator\n"
        "after_import = sorted(m for m in sys.modules if m.startswith(('drivetrain.big_modeling', "
        "'drivetrain.checkpoint', 'drivetrain.commands', 'drivetrain.config.file')))\n"
        "a = Accelerator(cpu=True)\n"
        "model = a.prepare(torch.nn.Linear(2, 2))\n"
        "from importlib.metadata import entry_points\n"
        "devices = {e.value.split('.')[0] for e in entry_points(group='drivetrain.devices')}\n"
        "print(after_import, sorted(m for m in set(sys.modules) - started if m.startswith('drivetrain_') "
        "and m.split('.')[0] not in devices), sorted(m for m in sys.modules if m.split('.')[0] in ('attr', 'attrs')))\n"
    )
    # device plugins (listed in drivetrain.devices) are imported by every process, by design; the kernel's
    # configuration objects are stdlib dataclasses, so attrs (a tenth of the import's cost) is not imported
    assert loaded == "[] [] []"
