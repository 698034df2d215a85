"""Accelerate's public names (peer/reference_names.json, the pinned reference's snapshot) are importable from
drivetrain's modules of the same path: implemented, or owned by a plugin (importable; using it names the
distribution to install). The names not there yet are listed with their reason in peer/name_gaps.toml: a new
gap fails here, and so does a listed gap that has been filled (take it off the list)."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from peer import names as reference

REPOSITORY = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def coverage():
    return reference.coverage()


def test_every_reference_name_is_importable_or_a_listed_gap(coverage):
    known = reference.known_gaps()
    missing = {
        f"{module}:{name}": detail
        for module, found in coverage.items()
        for name, (status, detail) in found.items()
        if status == "missing"
    }
    new = {key: detail for key, detail in missing.items() if key not in known}
    filled = sorted(key for key in known if key not in missing)
    assert not new, (
        "Accelerate names drivetrain lacks (implement them, or list them in peer/name_gaps.toml):\n"
        + "\n".join(f"{key}: {detail}" for key, detail in sorted(new.items()))
    )
    assert not filled, "listed in peer/name_gaps.toml but importable now (take them off):\n" + "\n".join(
        filled
    )


def _hide_plugin(monkeypatch, distribution: str, provides) -> None:
    """Make ``distribution`` look uninstalled: its entry points (those ``provides`` picks) are gone and its
    version lookup fails, as in an environment without it."""
    installed = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kwargs: [entry for entry in installed(**kwargs) if not provides(entry)],
    )
    version = importlib.metadata.version

    def not_installed(name):
        if name == distribution:
            raise importlib.metadata.PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)


@pytest.fixture
def resolved_names_forgotten():
    """The tests below resolve names while a plugin is hidden, and a resolved name is kept on its module: the
    placeholders they leave are taken off again, for the tests that run later with the plugin present."""
    before = set(_placeholders())
    yield
    for module, name in set(_placeholders()) - before:
        delattr(sys.modules[module], name)


def _placeholders():
    """(module, name) of every plugin-name placeholder kept on a drivetrain module."""
    from drivetrain.compat.placeholders import _MissingPluginName

    for module_name, module in list(sys.modules.items()):
        if module_name.partition(".")[0] == "drivetrain":
            for name, value in list(vars(module).items()):
                if isinstance(value, _MissingPluginName):
                    yield module_name, name


@pytest.mark.usefixtures("resolved_names_forgotten")
def test_a_plugin_name_without_its_plugin_is_importable_and_names_the_distribution(monkeypatch):
    _hide_plugin(monkeypatch, "drivetrain-fp8", lambda entry: entry.name == "FP8RecipeKwargs")
    from drivetrain.contract.reexport import reexport

    importlib.import_module("drivetrain.utils.dataclasses")
    getattr_, _, public = reexport("drivetrain.utils.dataclasses", {})
    assert "FP8RecipeKwargs" in public
    placeholder = getattr_("FP8RecipeKwargs")
    assert not isinstance(object(), placeholder)  # isinstance checks against it keep working
    with pytest.raises(
        ImportError,
        match=r"^FP8RecipeKwargs is provided by a plugin that is not installed: pip install drivetrain-fp8$",
    ):
        placeholder(backend="te")


@pytest.mark.usefixtures("resolved_names_forgotten")
def test_quantization_names_without_the_bnb_plugin_name_it(monkeypatch):
    """drivetrain-bnb is published: without it, Accelerate's bitsandbytes names say to install it."""
    _hide_plugin(monkeypatch, "drivetrain-bnb", lambda entry: entry.value.startswith("drivetrain_bnb"))
    from drivetrain.contract.reexport import reexport

    for module, name in (
        ("drivetrain.utils.dataclasses", "BnbQuantizationConfig"),
        ("drivetrain.utils", "load_and_quantize_model"),
        ("drivetrain.utils.bnb", "replace_with_bnb_layers"),
    ):
        importlib.import_module(
            module
        )  # as when the name is imported from it: the module keeps what it resolves
        placeholder = reexport(module, {})[0](name)
        with pytest.raises(
            ImportError,
            match=rf"^{name} is provided by a plugin that is not installed: pip install drivetrain-bnb$",
        ):
            placeholder(load_in_8bit=True)


def test_names_of_unpublished_plugins_say_so_instead_of_naming_a_package_to_install():
    from drivetrain.compat.distributions import UNPUBLISHED_DISTRIBUTIONS
    from drivetrain.compat.paths import PLUGIN_NAMES_BY_PATH

    for module, name in (
        ("drivetrain.inference", "prepare_pippy"),
        ("drivetrain.utils", "prepare_sagemager_args_inputs"),
    ):
        placeholder = getattr(importlib.import_module(module), name)
        with pytest.raises(
            ImportError, match=rf"^{name} is not available in drivetrain yet: .* is not published"
        ):
            placeholder()
    # every distribution a placeholder names either is one of ours or is listed as unpublished
    ours = {path.parent.name for path in (REPOSITORY / "plugins").glob("*/pyproject.toml")}
    ours |= {path.parent.name for path in (REPOSITORY / "contrib").glob("*/pyproject.toml")}
    named = {distribution for table in PLUGIN_NAMES_BY_PATH.values() for distribution in table.values()}
    unknown = {d for d in named - set(UNPUBLISHED_DISTRIBUTIONS) if d.removeprefix("drivetrain-") not in ours}
    assert not unknown, f"placeholders name distributions nobody ships: {sorted(unknown)}"


def test_snapshot_covers_the_paths_scripts_import():
    modules = reference.reference_names()
    for path in (
        "accelerate.utils.modeling",
        "accelerate.utils.operations",
        "accelerate.utils.dataclasses",
        "accelerate.utils.constants",
        "accelerate.commands.config.config_args",
        "accelerate.commands.launch",
        "accelerate.tracking",
        "accelerate.local_sgd",
        "accelerate.parallelism_config",
    ):
        assert path in modules
    assert "set_module_tensor_to_device" in modules["accelerate.utils.modeling"]
    assert "LOGGER_TYPE_TO_CLASS" in modules["accelerate.tracking"]


def test_a_compatibility_path_loads_only_itself():
    """Importing an Accelerate path imports neither torch nor the modules its names live in."""
    code = (
        "import sys, drivetrain.utils.modeling, drivetrain.utils.operations, drivetrain.utils.dataclasses, "
        "drivetrain.hooks, drivetrain.local_sgd, drivetrain.utils.offload;"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('drivetrain.big_modeling', "
        "'drivetrain.operations', 'drivetrain.config.dataclasses'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
