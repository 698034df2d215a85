"""The reference's released source: downloaded once from the package index with pip, checked against a pinned
sha256, extracted into the cache, and laid out as a work folder per side (renamed for drivetrain, as released
for the reference)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from peer import rename

REFERENCE = "accelerate"
VERSION = "1.15.0"
# sha256 of accelerate-1.15.0.tar.gz as the package index serves it.
SDIST_SHA256 = "5654f8c5eaa0d4fa68b33e287a97765da6849bf6d51dcac874e73fbbddfb6134"


def download_sdist(folder: Path, name: str, version: str, sha256: str) -> Path:
    """``name==version``'s source distribution in ``folder``, downloaded with pip the first time and checked
    against ``sha256`` every time (hfstack/ takes peft's and trl's this way too)."""
    path = folder / f"{name}-{version}.tar.gz"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        print(f"downloading {name}=={version} (sdist) into {folder}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--no-binary", ":all:", f"{name}=={version}", "--dest", str(folder)],
            check=True,
        )  # fmt: skip
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{path} has sha256 {digest}, expected {sha256}: delete it and run again")
    return path


def extract_sdist(cache: Path, name: str, version: str, sha256: str) -> Path:
    """The sdist extracted once under ``cache/src`` (read-only use): returns the folder holding ``tests/``."""
    root = cache / "src" / f"{name}-{version}"
    if not (root / "tests").is_dir():
        archive = download_sdist(cache / "sdist", name, version, sha256)
        (cache / "src").mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(cache / "src", filter="data")
    return root


def sdist(cache: Path) -> Path:
    """The pinned sdist in the cache, downloaded with pip the first time."""
    return download_sdist(cache / "sdist", REFERENCE, VERSION, SDIST_SHA256)


def extracted(cache: Path) -> Path:
    """The sdist extracted once (read-only use): returns the folder holding `tests/` and `src/`."""
    return extract_sdist(cache, REFERENCE, VERSION, SDIST_SHA256)


def prepare_work(cache: Path, side: str, folder: str | None = None) -> Path:
    """A fresh work folder for one side: `tests/` and `test_utils/` (renamed for drivetrain), and for drivetrain
    `site/sitecustomize.py`, which serves that test_utils as `drivetrain.test_utils` (see peer/overlay.py)."""
    root = extracted(cache)
    work = cache / "work" / (folder or side)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tests, test_utils = root / "tests", root / "src" / REFERENCE / "test_utils"
    if side == "reference":
        shutil.copytree(tests, work / "tests")
        shutil.copytree(test_utils, work / "test_utils")
        return work
    log = {
        "tests": rename.rename_tree(tests, work / "tests"),
        "test_utils": rename.rename_tree(test_utils, work / "test_utils"),
    }
    (work / "rename-log.json").write_text(json.dumps(log, indent=1))
    (work / "site").mkdir()
    shutil.copy(Path(__file__).with_name("overlay.py"), work / "site" / "sitecustomize.py")
    return work
