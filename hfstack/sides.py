"""The two sides of a harness run: one interpreter (the project's .venv), two answers to ``import accelerate``.

Both sides put, first on PYTHONPATH, a start-up folder (hfstack/startup/: the network guard) and the source's
overlay: the libraries whose tests run, at the versions the harness judges with (``Source.requirements`` in
hfstack/sources.py), installed there with ``pip install --target --no-deps`` so .venv's own copies stay as
scripts/setup left them.

- ``reference``: a ``reference`` overlay holds ``accelerate==1.15.0``; it comes before site-packages, so it
  serves ``import accelerate`` and ``importlib.metadata.version("accelerate")``.
- ``drivetrain``: drivetrain serves ``import accelerate``, in one of two ways (``SERVED_BY``):
  ``distribution`` (the ``drivetrain-accelerate`` distribution is installed in .venv: nothing is added) or
  ``alias`` (it is not: the start-up folder maps ``accelerate.*`` onto ``drivetrain.*`` and carries an
  ``accelerate`` dist-info with drivetrain's version; hfstack/startup/hfstack_alias.py). ``auto`` picks
  ``distribution`` when it is installed.

Every run starts with a probe on each side that checks who answers ``import accelerate``; a side that gets
the wrong one stops the run with the reason (the reference's overlay must win over anything in .venv).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from hfstack.sources import Source

HFSTACK = Path(__file__).resolve().parent
REFERENCE = "accelerate==1.15.0"
SERVED_BY = "auto"  # "alias", "distribution" or "auto" (distribution when drivetrain-accelerate is installed)
DISTRIBUTION = "drivetrain-accelerate"

PROBE = """
import importlib.metadata, json, os, sys
import accelerate
try:
    import hfstack_blockers
    patched = hfstack_blockers.PATCHED
except ImportError:
    patched = []
print("HFSTACK_PROBE " + json.dumps({
    "file": getattr(accelerate, "__file__", None),
    "accelerator_module": accelerate.Accelerator.__module__,
    "version": importlib.metadata.version("accelerate"),
    "attribute_version": getattr(accelerate, "__version__", None),
    "patched": patched,
}))
"""


def _pip_target(python: Path, target: Path, requirements: list[str]) -> None:
    stamp = target / ".hfstack-requirements"
    wanted = "\n".join(requirements)
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    print(f"hfstack: installing {', '.join(requirements)} into {target}", flush=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--target", str(target), *requirements],
        check=True,
    )  # fmt: skip
    stamp.write_text(wanted)


def served_by(python: Path, choice: str = SERVED_BY) -> str:
    if choice != "auto":
        return choice
    done = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; m.distribution({DISTRIBUTION!r})"],
        capture_output=True,
    )
    return "distribution" if done.returncode == 0 else "alias"


def _drivetrain_version(python: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", "import drivetrain; print(drivetrain.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


class Side:
    """One side's environment: which folders go on PYTHONPATH and which HFSTACK_* variables are set."""

    def __init__(self, name: str, python: Path, cache: Path, serve: str = SERVED_BY, patch_blockers=True):
        self.name, self.python, self.cache = name, python, cache
        self.startup = cache / "startup" / name
        self.reference = cache / "overlay" / "reference"
        self.served_by = served_by(python, serve) if name == "drivetrain" else "accelerate"
        self.patch_blockers = patch_blockers and self.served_by == "alias"

    def overlay(self, source: Source) -> Path:
        """The folder holding the source's requirements; sources that ask for the same share one."""
        digest = hashlib.sha256("\n".join(sorted(source.requirements)).encode()).hexdigest()[:12]
        return self.cache / "overlay" / digest

    def prepare(self, sources: list[Source]) -> None:
        """Install the overlays (once; again when the pins change) and lay out the start-up folder."""
        for source in sources:
            _pip_target(self.python, self.overlay(source), list(source.requirements))
        if self.name == "reference":
            _pip_target(self.python, self.reference, [REFERENCE])
        if self.startup.exists():
            shutil.rmtree(self.startup)
        shutil.copytree(HFSTACK / "startup", self.startup, ignore=shutil.ignore_patterns("__pycache__"))
        if self.name == "drivetrain" and self.served_by == "alias":
            version = _drivetrain_version(self.python)
            dist_info = self.startup / f"accelerate-{version}.dist-info"
            dist_info.mkdir()
            (dist_info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: accelerate\nVersion: {version}\n"
                "Summary: accelerate served by drivetrain (hfstack alias)\n"
            )
            (dist_info / "top_level.txt").write_text("accelerate\n")

    def env(self, source: Source, tmp: Path, network_log: Path) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(
                ("ACCELERATE_", "DRIVETRAIN_", "PYTHON", "HFSTACK_", "HF_", "TRANSFORMERS_")
            )
            and key not in ("VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")
        }
        path = [self.startup, self.overlay(source)] + ([self.reference] if self.name == "reference" else [])
        env.update(
            PYTHONPATH=os.pathsep.join(map(str, path)),
            PATH=f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}",
            VIRTUAL_ENV=str(self.python.parent.parent),
            OMP_NUM_THREADS="1",
            TMPDIR=str(tmp),
            HF_HOME=str(self.cache / "hf-home"),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            WANDB_MODE="offline",
            PYTHONUNBUFFERED="1",
            HFSTACK_NETWORK_LOG=str(network_log),
        )
        if self.name == "reference":
            # drivetrain-accelerate's start-up finder, when installed, steps aside for this process
            env["DRIVETRAIN_ACCELERATE"] = "0"
        if self.name == "drivetrain" and self.served_by == "alias":
            env["HFSTACK_ALIAS"] = "1"
            if self.patch_blockers:
                env["HFSTACK_PATCH_BLOCKERS"] = "1"
        return env

    def probe(self, source: Source, tmp: Path) -> dict:
        """Who answers ``import accelerate`` on this side; stops the run when it is the wrong one."""
        tmp.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [str(self.python), "-c", PROBE],
            env=self.env(source, tmp, tmp / "probe-network.log"),
            capture_output=True,
            text=True,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("HFSTACK_PROBE ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"hfstack [{self.name}]: `import accelerate` fails here:\n{done.stderr[-3000:]}")
        found = json.loads(lines[-1].split(" ", 1)[1])
        if self.name == "reference":
            inside = found["file"] and Path(found["file"]).resolve().is_relative_to(self.reference.resolve())
            wanted = REFERENCE.split("==")[1]
            if (
                not inside
                or not found["accelerator_module"].startswith("accelerate.")
                or found["version"] != wanted
            ):
                raise SystemExit(
                    f"hfstack [reference]: `import accelerate` gives {found['file']} (Accelerator from "
                    f"{found['accelerator_module']}, metadata version {found['version']}), not the real "
                    f"Accelerate {wanted} installed in "
                    f"{self.reference}: something in .venv takes precedence over PYTHONPATH (an import hook "
                    "in a .pth file?)"
                )
        elif not found["accelerator_module"].startswith("drivetrain"):
            raise SystemExit(
                f"hfstack [drivetrain]: `import accelerate` gives {found['file']} (Accelerator from "
                f"{found['accelerator_module']}), not drivetrain ({self.served_by})"
            )
        return found
