"""The module paths with no file (compat.paths.GENERATED_MODULES): Accelerate's, and drivetrain's own that scripts
and documents use (``drivetrain.testing``, ``python -m drivetrain.launch``), made by the import hook from their
tables. Accelerate's names on them are checked by test_compat_names.py; here, the rest of what the files did."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain.compat import paths

KERNEL = Path(__file__).resolve().parents[2] / "core" / "drivetrain"


@pytest.mark.filterwarnings("ignore:memory_utils moved:FutureWarning")  # checked below
@pytest.mark.parametrize("module_name", sorted(paths.GENERATED_MODULES))
def test_a_generated_path_has_no_file_and_every_name_of_its_table_resolves(module_name):
    relative = Path(*module_name.split(".")[1:])
    assert not (KERNEL / relative).with_suffix(".py").exists() and not (KERNEL / relative).is_dir()
    module = importlib.import_module(module_name)
    for name, target in paths.GENERATED_MODULES[module_name].items():
        value = getattr(module, name)
        if target != paths.LOGGER:
            module_path, _, attribute = target.partition(":")
            assert value is getattr(importlib.import_module(module_path), attribute or name)


def test_the_data_loader_path_holds_every_loader_of_the_data_package():
    import drivetrain.data
    import drivetrain.data_loader

    assert set(drivetrain.data.__all__) <= set(drivetrain.data_loader.__all__)


def test_prepared_loaders_count_as_accelerates_base_classes():
    import torch
    from torch.utils.data import DataLoader

    from drivetrain.data_loader import DataLoaderAdapter, DataLoaderStateMixin, prepare_data_loader

    loader = prepare_data_loader(DataLoader(torch.arange(8), batch_size=2), put_on_device=False)
    assert isinstance(loader, DataLoaderStateMixin) and isinstance(loader, DataLoaderAdapter)


def test_module_loggers_are_named_after_the_path():
    import drivetrain.checkpointing
    import drivetrain.data_loader

    assert drivetrain.checkpointing.logger.logger.name == "drivetrain.checkpointing"
    assert drivetrain.data_loader.logger.logger.name == "drivetrain.data_loader"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_importing_memory_utils_warns_as_accelerate_does_at_the_importing_line():
    result = _run(
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import drivetrain.memory_utils\n"
        "print([(w.category.__name__, w.filename, w.lineno) for w in caught])\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[('FutureWarning', '<string>', 4)]"


def test_python_m_drivetrain_launch_runs_the_launcher():
    help_text = subprocess.run(
        [sys.executable, "-m", "drivetrain.launch", "--help"], capture_output=True, text=True, timeout=120
    )
    assert help_text.returncode == 0, help_text.stderr
    assert help_text.stdout.startswith("usage: drivetrain launch")
    refused = subprocess.run(
        [sys.executable, "-m", "drivetrain.launch", "--no_such_option", "train.py"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "unrecognized arguments: --no_such_option" in refused.stderr


def test_importing_drivetrain_launch_runs_nothing():
    result = _run("import drivetrain.launch, sys; print(drivetrain.launch.main.__module__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "drivetrain.commands.launch"


def test_the_import_hook_sits_before_the_file_system_and_after_finders_put_ahead_on_purpose():
    """Before PathFinder: a folder left where drivetrain/utils was (a stale __pycache__) must not import as an
    empty namespace package. After a finder installed first (the peer harness serves its own test_utils)."""
    code = (
        "import importlib.abc, importlib.machinery, sys\n"
        "class Harness(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, *args): return None\n"
        "sys.meta_path.insert(0, Harness())\n"
        "import drivetrain\n"
        "from drivetrain.contract.reexport import GeneratedModuleFinder\n"
        "kinds = [type(f).__name__ if not isinstance(f, type) else f.__name__ for f in sys.meta_path]\n"
        "print(kinds.index('Harness') < kinds.index('GeneratedModuleFinder') < kinds.index('PathFinder'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True", result.stdout + result.stderr
