"""The installs users really do, in fresh virtualenvs: drivetrain-accelerate and transformers, peft, trl in
either order. peft and trl depend on ``accelerate``; whatever pip does about it, the end state is drivetrain
serving ``import accelerate`` and no file of the real Accelerate imported. Then the documented way back.

Slow (a few minutes per virtualenv: torch and the stack are installed into each; PyPI for the stack, a local
wheelhouse for drivetrain's distributions): run by ``scripts/test-hf-stack``, skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[3]
OURS = ["core", "plugins/ddp", "plugins/fsdp", "plugins/offload", "plugins/mps", "contrib/accelerate"]
STACK = ["transformers", "peft", "trl"]
#: the versions the issue names, the reference Accelerate pip may bring, and the torch on this machine
CONSTRAINTS = "torch==2.13.0\ntransformers==5.23.0\npeft==0.21.2\ntrl==1.16.0\naccelerate==1.15.0\n"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),  # a virtualenv with torch and the stack: minutes on a busy 2-core machine
    pytest.mark.skipif(
        os.environ.get("HF_STACK_SLOW") != "1",
        reason="three fresh virtualenvs with torch and the stack (15-40 min): scripts/test-hf-stack runs them",
    ),
]

CHECK = textwrap.dedent(
    """
    import importlib.metadata, json, os, subprocess, sys, sysconfig
    site = sysconfig.get_paths()["purelib"]
    real_folder = os.path.join(site, "accelerate") + os.sep
    import accelerate, drivetrain
    from transformers import Trainer, TrainingArguments
    import peft, trl
    from accelerate import Accelerator
    Accelerator(cpu=True)
    from accelerate.utils import get_max_memory
    imported_real = sorted(
        name for name, module in list(sys.modules.items())
        if (getattr(module, "__file__", None) or "").startswith(real_folder)
    )
    env = subprocess.run([os.path.join(os.path.dirname(sys.executable), "accelerate"), "env"],
                         capture_output=True, text=True)
    print(json.dumps({
        "accelerate_is_drivetrain": accelerate is drivetrain,
        "accelerate_name": accelerate.__name__,
        "metadata_version": importlib.metadata.version("accelerate"),
        "real_files_present": os.path.isdir(real_folder),
        "imported_real": imported_real,
        "env_line": [line for line in env.stdout.splitlines() if "import accelerate" in line],
        "env_rc": env.returncode,
    }))
    """
)

WAY_BACK = textwrap.dedent(
    """
    import json, accelerate
    print(json.dumps({"name": accelerate.__name__, "file": accelerate.__file__, "version": accelerate.__version__}))
    """
)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheelhouse")
    sources = [str(REPOSITORY if project == "core" else REPOSITORY / project) for project in OURS]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "-w", str(folder),
         *sources],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def _venv(tmp_path: Path) -> Path:
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(tmp_path / "venv")], check=True)
    return tmp_path / "venv" / "bin" / "python"


def _pip(python: Path, wheelhouse: Path, constraints: Path, *args: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--find-links", str(wheelhouse), "-c", str(constraints), *args],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 0, f"pip install {' '.join(args)}:\n{done.stderr[-3000:]}"


def _run(python: Path, code: str, cwd: Path) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DRIVETRAIN_", "PYTHON"))}
    environment.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=cwd, env=environment, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("plan", "real_installed"),
    [
        pytest.param([["drivetrain-accelerate"], STACK], False, id="drivetrain-accelerate-then-stack"),
        pytest.param([STACK, ["drivetrain-accelerate"]], True, id="stack-then-drivetrain-accelerate"),
        pytest.param([["drivetrain-accelerate", *STACK]], True, id="one-command"),
    ],
)
def test_drivetrain_serves_accelerate_whatever_the_install_order(tmp_path, wheelhouse, plan, real_installed):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(CONSTRAINTS)
    python = _venv(tmp_path)
    for command in plan:
        _pip(python, wheelhouse, constraints, *command)
    found = _run(python, CHECK, tmp_path)
    assert found["accelerate_is_drivetrain"] and found["accelerate_name"] == "drivetrain"
    assert found["metadata_version"] == "1.15.0"
    assert found["imported_real"] == []
    # pip counts drivetrain-accelerate's metadata as the installed Accelerate when it comes first
    assert found["real_files_present"] is real_installed
    assert found["env_rc"] == 0
    line = found["env_line"][0]
    assert "served by drivetrain (drivetrain-accelerate 1.15.0)" in line
    assert ("HuggingFace Accelerate 1.15.0 is installed too and never runs" in line) is real_installed

    # the documented way back (docs/hf-stack.md)
    done = subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "drivetrain-accelerate"])
    assert done.returncode == 0
    _pip(python, wheelhouse, constraints, "--force-reinstall", "--no-deps", "accelerate==1.15.0")
    _pip(python, wheelhouse, constraints, "accelerate==1.15.0")
    back = _run(python, WAY_BACK, tmp_path)
    assert back["name"] == "accelerate" and back["version"] == "1.15.0"
    assert "site-packages/accelerate/__init__.py" in back["file"]
    assert (python.parent / "accelerate").is_file()
