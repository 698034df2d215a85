"""drivetrain-accelerate serves ``import accelerate``: every module path of the reference is drivetrain's module
of that path (the same object), its version passes the gates of transformers, peft and trl, and the
``accelerate`` commands are drivetrain's."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import drivetrain

REPOSITORY = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parents[1]
REFERENCE_MODULES = json.loads((REPOSITORY / "peer" / "reference_names.json").read_text())["modules"]


def test_import_accelerate_is_drivetrain():
    import accelerate

    assert accelerate is drivetrain
    assert accelerate.Accelerator is drivetrain.Accelerator
    assert accelerate.__version__ == drivetrain.__accelerate_api__


@pytest.mark.parametrize("path", REFERENCE_MODULES)
def test_every_module_path_of_the_reference_is_drivetrains_module(path):
    served = importlib.import_module(path)
    own = importlib.import_module("drivetrain" + path[len("accelerate") :])
    assert served is own
    assert sys.modules[path] is own
    # drivetrain's module keeps its own identity (reload, pickling by path, find_spec)
    assert own.__spec__.name == own.__name__


def test_a_path_drivetrain_lacks_is_a_plain_module_not_found():
    with pytest.raises(ModuleNotFoundError, match="accelerate.no_such_module"):
        importlib.import_module("accelerate.no_such_module")


def test_a_patch_on_an_accelerate_path_patches_drivetrain(monkeypatch):
    import accelerate.big_modeling

    import drivetrain.big_modeling

    sentinel = object()
    monkeypatch.setattr(accelerate.big_modeling, "check_device_map", sentinel)
    assert drivetrain.big_modeling.check_device_map is sentinel


def test_transformers_skip_device_map_check_reaches_dispatch_model():
    # transformers swaps accelerate.big_modeling.check_device_map for a no-op around some dispatches
    torch = pytest.importorskip("torch")
    accelerate_integration = pytest.importorskip("transformers.integrations.accelerate")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    incomplete = {"0": "cpu"}
    import accelerate

    with pytest.raises(ValueError):
        accelerate.dispatch_model(model, incomplete)
    with accelerate_integration.skip_device_map_check():
        accelerate.big_modeling.check_device_map(model, incomplete)  # the no-op is in place
    assert accelerate.big_modeling.check_device_map is drivetrain.big_modeling.device_map.check_device_map


def test_version_is_the_accelerate_api_and_passes_the_stacks_gates():
    from packaging.requirements import Requirement

    version = importlib.metadata.version("accelerate")
    pyproject = tomllib.loads((HERE / "pyproject.toml").read_text())
    pkg_info = (HERE / "metadata" / "PKG-INFO").read_text()
    assert version == drivetrain.__accelerate_api__ == pyproject["project"]["version"]
    assert f"Version: {version}" in pkg_info
    checked = []
    for library in ("transformers", "peft", "trl"):
        try:
            requirements = importlib.metadata.requires(library) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requirements:
            requirement = Requirement(line)
            if requirement.name == "accelerate":
                assert requirement.specifier.contains(version), (library, str(requirement))
                checked.append(library)
    transformers = pytest.importorskip("transformers")
    from transformers.utils import import_utils

    assert transformers.utils.is_accelerate_available()
    assert import_utils.ACCELERATE_MIN_VERSION and transformers.utils.is_accelerate_available(
        import_utils.ACCELERATE_MIN_VERSION
    )
    assert {"peft", "trl"} <= set(checked) or not checked


@pytest.mark.parametrize(
    "command",
    ["launch", "config", "env", "estimate-memory", "merge-weights", "test", "tpu-config", "to-fsdp2"],
)
def test_every_accelerate_command_is_drivetrains(command, capsys):
    from accelerate.commands.accelerate_cli import main

    from drivetrain.commands import main as drivetrain_main

    assert main is drivetrain_main.main
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


def _venv_bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def test_the_console_command_and_env_say_who_serves_accelerate(tmp_path):
    done = subprocess.run(
        [_venv_bin("accelerate"), "env"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "`import accelerate`: served by drivetrain (drivetrain-accelerate 1.15.0)" in done.stdout


def test_python_dash_m_accelerate_commands_runs_drivetrains_launcher(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "--num_processes" in done.stdout and "--backend" in done.stdout  # --backend is drivetrain's own


def test_the_switch_leaves_accelerate_to_the_rest_of_the_path(tmp_path):
    # DRIVETRAIN_ACCELERATE=0: the finder is not installed for the process, so `import accelerate` is whatever the
    # rest of the path holds: nothing, or the real Accelerate's files when pip installed them beside ours (peft
    # depends on accelerate, so a fresh environment installing requirements-dev.txt first has them). Never
    # drivetrain.
    code = (
        "import importlib.util, sys; spec = importlib.util.find_spec('accelerate'); "
        "print(any(type(f).__name__ == 'AccelerateFinder' for f in sys.meta_path), "
        "'absent' if spec is None else ('drivetrain' if 'drivetrain' in (spec.origin or '') else 'other'))"
    )
    env = {**os.environ, "DRIVETRAIN_ACCELERATE": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    finder, served = done.stdout.split()
    assert finder == "False" and served in ("absent", "other"), done.stdout + done.stderr
    env["DRIVETRAIN_ACCELERATE"] = "1"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["True", "drivetrain"], done.stdout + done.stderr


def test_start_up_imports_only_the_standard_library():
    # the .pth runs in every interpreter of the environment: it must not import drivetrain or torch
    code = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'drivetrain')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr
    code = "import sys; print(any(type(f).__name__ == 'AccelerateFinder' for f in sys.meta_path))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr
