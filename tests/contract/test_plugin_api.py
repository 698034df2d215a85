"""Contract 1.2's plugin API as a plugin sees it: the names at the top and in the namespaces, contract 1.1's
flat names (still importing, with a warning naming the new place), and the helpers 1.2 added for backends
(the reference backward, the unwrap rule). docs/plugins/api.md and docs/plugins/versioning.md."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest
import torch

import drivetrain.plugin_api as plugin_api
from drivetrain import hookimpl
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.plugin_api import DistributedEnvironment, PluginInfo
from drivetrain.plugin_api._moved import ADDED_IN_1_2, REMOVED, moved
from drivetrain.plugin_api.training import reference_backward

ROOT = Path(__file__).resolve().parents[2]


def test_the_top_holds_about_25_names_and_every_declared_name_is_defined():
    assert 20 <= len(plugin_api.__all__) <= 30, plugin_api.__all__
    for name in plugin_api.__all__:
        assert name in vars(plugin_api), f"plugin_api.{name} is declared but not defined in the module"
    for namespace in plugin_api.NAMESPACES:
        module = importlib.import_module(f"drivetrain.plugin_api.{namespace}")
        assert module.__all__, namespace
        for name in module.__all__:
            assert name in vars(module), f"plugin_api.{namespace}.{name} is declared but not defined"
            assert name not in plugin_api.__all__, f"{name} is both at the top and in plugin_api.{namespace}"


def test_every_1_1_name_still_imports_with_a_warning_naming_its_1_2_place(monkeypatch):
    assert set(moved()) == {  # every helper of a namespace, except those 1.2 added, was a 1.1 flat name
        name
        for namespace in plugin_api.NAMESPACES
        for name in importlib.import_module(f"drivetrain.plugin_api.{namespace}").__all__
        if name not in ADDED_IN_1_2
    }
    for name, place in moved().items():
        monkeypatch.delitem(vars(plugin_api), name, raising=False)  # a name read before is kept: forget it
        with pytest.warns(DeprecationWarning) as caught:
            value = getattr(plugin_api, name)
        expected = f"import it from drivetrain.plugin_api.{place}"
        assert expected in str(caught[0].message), (name, str(caught[0].message))
        assert value is getattr(importlib.import_module(f"drivetrain.plugin_api.{place}"), name)
    for name, (module, attribute, advice) in REMOVED.items():
        monkeypatch.delitem(vars(plugin_api), name, raising=False)
        with pytest.warns(DeprecationWarning, match=re.escape(advice)):
            assert getattr(plugin_api, name) is getattr(importlib.import_module(module), attribute)


def test_the_warning_points_at_the_plugin_that_imports_and_comes_once(tmp_path, monkeypatch):
    monkeypatch.delitem(vars(plugin_api), "safe_load", raising=False)
    plugin = tmp_path / "old_plugin.py"
    plugin.write_text("from drivetrain.plugin_api import PluginInfo, safe_load\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.import_module("old_plugin")
        from drivetrain.plugin_api import safe_load  # noqa: F401 - read again: no second warning
    deprecations = [warning for warning in caught if warning.category is DeprecationWarning]
    assert len(deprecations) == 1
    assert deprecations[0].filename == str(plugin) and deprecations[0].lineno == 1


def test_an_unknown_name_says_where_the_names_are():
    with pytest.raises(AttributeError, match="plugins import only what it declares .see docs/plugins/api.md"):
        plugin_api.not_a_name  # noqa: B018


def test_a_namespace_reads_as_an_attribute_too():
    assert (
        plugin_api.checkpoint.safe_load
        is importlib.import_module("drivetrain.plugin_api.checkpoint").safe_load
    )


def test_a_contract_1_1_plugin_module_loads_and_runs(tmp_path, monkeypatch):
    """A 1.1 backend as third parties wrote it (flat names, contract="1.1") still trains under 1.2."""
    (tmp_path / "old_backend.py").write_text(
        textwrap.dedent(
            """
            from drivetrain import hookimpl
            from drivetrain.plugin_api import DistributedEnvironment, PluginInfo, prepare_data_loader

            PLUGIN_INFO = PluginInfo(kind="backend", contract="1.1")

            @hookimpl
            def setup_process_group():
                return DistributedEnvironment()

            @hookimpl
            def shard_dataloader(dataloader, options):
                return prepare_data_loader(dataloader, **options.to_kwargs())
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(vars(plugin_api), "prepare_data_loader", raising=False)
    with pytest.warns(DeprecationWarning, match="drivetrain.plugin_api.data"):
        module = importlib.import_module("old_backend")
    get_plugin_registry().register("old_backend", module)
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="old_backend")
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=4))
    assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_migration_script_moves_flat_imports_to_their_namespaces(tmp_path):
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "from drivetrain.plugin_api import PluginInfo, safe_load as load, prepare_data_loader\n"
        "def f(plugin_api):\n"
        "    return plugin_api.write_model_files\n"
    )
    script = str(ROOT / "scripts" / "plugin_api_migrate.py")
    check = subprocess.run([sys.executable, script, "--check", str(tmp_path)], capture_output=True, text=True)
    assert check.returncode == 1 and "imports contract 1.1 flat names" in check.stdout
    assert plugin.read_text().startswith(
        "from drivetrain.plugin_api import PluginInfo, safe_load"
    )  # unchanged
    result = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert plugin.read_text().splitlines()[:3] == [
        "from drivetrain.plugin_api import PluginInfo",
        "from drivetrain.plugin_api.checkpoint import safe_load as load",
        "from drivetrain.plugin_api.data import prepare_data_loader",
    ]
    # an attribute read is not rewritten, but named with its new place
    assert (
        "3: plugin_api.write_model_files -> drivetrain.plugin_api.checkpoint.write_model_files"
        in result.stdout
    )


def test_reference_backward_scales_the_loss_and_passes_backward_kwargs():
    weight = torch.nn.Parameter(torch.tensor([2.0]))
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    accelerator = types.SimpleNamespace(scaler=scaler)
    loss = (weight * 3.0).sum()
    reference_backward(loss, accelerator, {"retain_graph": True})  # type: ignore[arg-type]
    assert weight.grad is not None and weight.grad.item() == 24.0  # d(3w)/dw = 3, times the scale 8
    reference_backward(loss, types.SimpleNamespace(scaler=None), {})  # type: ignore[arg-type]
    assert weight.grad.item() == 27.0  # the graph was retained: a second backward adds 3


def test_a_backend_adds_its_step_after_the_reference_backward():
    """What docs/plugins/tutorial.md shows: reference_backward, then the backend's own step, then True."""
    steps = []

    @hookimpl
    def backward(loss, accelerator, backward_kwargs):
        reference_backward(loss, accelerator, backward_kwargs)
        steps.append([parameter.grad.clone() for parameter in accelerator.prepared.models[0].parameters()])
        return True

    plugin = types.SimpleNamespace(
        PLUGIN_INFO=PluginInfo(kind="backend"),
        setup_process_group=hookimpl(lambda: DistributedEnvironment()),
        backward=backward,
    )
    get_plugin_registry().register("stepping", plugin)
    from drivetrain import Accelerator

    accelerator = Accelerator(backend="stepping", gradient_accumulation_steps=2)
    model = accelerator.prepare(torch.nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        model.weight.fill_(1.0)
    accelerator.backward(model(torch.ones(1, 2)).sum())
    assert len(steps) == 1 and steps[0][0].tolist() == [
        [0.5, 0.5]
    ]  # loss divided by the 2 accumulation steps


def test_unwrap_model_finds_the_module_in_a_wrapper_without_a_module_attribute():
    """The unwrap rule (PluginAccelerator.unwrap_model): what wrap_model returns needs no ``module``."""

    class Holder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    plugin = types.SimpleNamespace(
        PLUGIN_INFO=PluginInfo(kind="backend"),
        setup_process_group=hookimpl(lambda: DistributedEnvironment()),
        wrap_model=hookimpl(lambda model: Holder(model)),
    )
    get_plugin_registry().register("holder", plugin)
    from drivetrain import Accelerator
    from drivetrain.utils import extract_model_from_parallel

    accelerator = Accelerator(backend="holder")
    model = torch.nn.Linear(2, 2)
    prepared = accelerator.prepare(model)
    assert isinstance(prepared, Holder) and not hasattr(prepared, "module")
    assert accelerator.unwrap_model(prepared) is model
    assert extract_model_from_parallel(prepared) is model  # Accelerate's function follows the same rule
