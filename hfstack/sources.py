"""Where each library's tests come from, and the work folder they run in.

- peft and trl: their source distributions on the package index, downloaded once with pip and checked against
  a pinned sha256 (peer/source.py does the same for Accelerate's).
- transformers: its source distribution has no ``tests/trainer/``, and the repository is not reachable from CI.
  The three files are read from a folder (``--sources``; default ``<cache>/sources/transformers``) or from
  ``hfstack/vendor/transformers`` when the repository carries them; each is pinned by the commit it was taken
  from, and the sha256 of what ran is recorded in the results. ``scripts/hfstack --import-transformers
  CHECKOUT`` fills the folder from a transformers git checkout (``git show COMMIT:PATH``).

Each file's provenance (version or commit) is in ``SOURCES`` and is printed in docs/hf-stack-harness.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
from pathlib import Path

from peer.source import extract_sdist

HFSTACK = Path(__file__).resolve().parent
VENDOR = HFSTACK / "vendor"


@dataclasses.dataclass(frozen=True)
class PinnedFile:
    path: str
    commit: str
    sha256: str  # of the file as it ran when the reference's results were recorded


@dataclasses.dataclass(frozen=True)
class Source:
    name: str  # the library: transformers, peft, trl
    version: str  # the version installed in the harness's environment
    files: tuple[str, ...]  # the test files run, relative to the work folder
    fast: tuple[str, ...]  # the subset CI runs (scripts/extra-tests)
    sdist_sha256: str = ""  # for a source taken from its source distribution
    pinned: tuple[PinnedFile, ...] = ()  # for a source taken file by file from its repository
    repository: str = ""
    on_request: tuple[str, ...] = ()  # files run only when named (--with)
    # what the harness installs for this source's runs (both sides), with `pip install --target --no-deps`;
    # everything else comes from .venv
    requirements: tuple[str, ...] = ()

    @property
    def provenance(self) -> str:
        if self.pinned:
            commits = sorted({f"`{p.path.rsplit('/', 1)[-1]}` @ {p.commit[:12]}" for p in self.pinned})
            return f"{self.repository} repository files: " + ", ".join(commits)
        return f"{self.name}=={self.version} source distribution (sha256 {self.sdist_sha256[:16]}...)"


# peft's tests that go through transformers' Trainer or import accelerate; test_decoder_models.py (~9,000
# tests, most of them model x adapter combinations that do not touch accelerate) only with --with.
PEFT_FILES = (
    "tests/test_cpt.py",
    "tests/test_frod.py",
    "tests/test_helpers.py",
    "tests/test_pvera.py",
    "tests/test_quantization.py",
    "tests/test_randlora.py",
    "tests/test_shira.py",
    "tests/test_torch_compile.py",
    "tests/test_vblora.py",
    "tests/test_vera.py",
    "tests/test_vision_models.py",
    "tests/test_common_gpu.py",
    "tests/test_gpu_examples.py",
    "tests/test_gptqmodel.py",
)

# trl's trainers are built on transformers' Trainer and accelerate: every trainer test file, and the utilities
# and callbacks that call accelerate. Left out: test_vllm_client_server.py (starts a vLLM server),
# test_cli.py (downloads models and data sets by name), test_alignprop/ddpo (diffusers pipelines).
TRL_FILES = (
    "tests/test_activation_offloading.py",
    "tests/test_bco_trainer.py",
    "tests/test_callbacks.py",
    "tests/test_cpo_trainer.py",
    "tests/test_dpo_trainer.py",
    "tests/test_gkd_trainer.py",
    "tests/test_grpo_trainer.py",
    "tests/test_iterative_sft_trainer.py",
    "tests/test_kto_trainer.py",
    "tests/test_modeling_value_head.py",
    "tests/test_nash_md_trainer.py",
    "tests/test_online_dpo_trainer.py",
    "tests/test_orpo_trainer.py",
    "tests/test_peft_models.py",
    "tests/test_ppo_trainer.py",
    "tests/test_prm_trainer.py",
    "tests/test_reward_trainer.py",
    "tests/test_rloo_trainer.py",
    "tests/test_sft_trainer.py",
    "tests/test_trainers_args.py",
    "tests/test_utils.py",
    "tests/test_xpo_trainer.py",
)

# transformers' and peft's runs share one overlay; peft's test_helpers.py imports diffusers (which imports
# accelerate in turn)
TRANSFORMERS_5 = ("transformers==5.23.0", "peft==0.21.2", "parameterized==0.9.0", "diffusers==0.42.1")

SOURCES = {
    "transformers": Source(
        name="transformers",
        version="5.23.0",
        repository="huggingface/transformers",
        files=("tests/trainer/test_trainer_accelerator.py", "tests/trainer/test_trainer_checkpointing.py"),
        requirements=TRANSFORMERS_5,
        fast=("tests/trainer/test_trainer_accelerator.py",),
        pinned=(
            PinnedFile(
                "tests/trainer/test_trainer_accelerator.py",
                "0d7e95d96b4e187c651e2b2406ed98ed40d74963",
                "24cf92afd2aaeddce8aa1f5c148ad25dbb38423038efb9978cdf7c22c6bd698c",
            ),
            PinnedFile(
                "tests/trainer/test_trainer_checkpointing.py",
                "abee4b14abf32637fe72990d0c409eaba189b31a",
                "fa731236d01d4189a302d0f619c375ef71b081cc5486f99e5fe97bc78c7c5475",
            ),
            PinnedFile(
                "tests/trainer/trainer_test_utils.py",
                "2d754248977f8e25edd8cd4d6d272e86f362d4a5",
                "105e9571fc5fd51b4851727908918e4d84652725e0c8b765e6d1b8c4bcbcc743",
            ),
        ),
    ),
    "peft": Source(
        name="peft",
        version="0.21.2",
        sdist_sha256="b803ccfb3f3f316004d850284306687833a2235ea278fb56abc856203456142e",
        files=PEFT_FILES,
        fast=("tests/test_vera.py",),
        on_request=("tests/test_decoder_models.py",),
        requirements=TRANSFORMERS_5,
    ),
    "trl": Source(
        name="trl",
        version="0.23.1",  # the newest trl whose source distribution carries its tests
        sdist_sha256="9a3025a9e7ea18fa4f3a5e575aa16b914d4ea86334b34689216af54562a460c5",
        files=TRL_FILES,
        fast=("tests/test_gkd_trainer.py",),
        # trl 0.23.1 reads transformers 4.x's `_is_package_available` (a bool; 5.x returns a tuple, which makes
        # every optional trl dependency look installed): it runs with the transformers 4.x it was released
        # with, and the hub client, tokenizers and datasets versions that transformers accepts
        requirements=(
            "trl==0.23.1",
            "transformers==4.57.6",
            "tokenizers==0.22.2",
            "huggingface_hub==0.36.2",
            "datasets==4.4.1",
            "peft==0.21.2",
            "parameterized==0.9.0",
        ),
    ),
}


class MissingSource(Exception):
    """A source's test files are not to be had here (the message says how to provide them)."""


def pinned_folder(cache: Path, source: Source, sources_dir: Path | None) -> Path:
    """The folder holding a repository-file source's pinned files: the repository's vendor/ copy first."""
    candidates = [VENDOR / source.name, sources_dir or cache / "sources" / source.name]
    for folder in candidates:
        if all((folder / pinned.path).is_file() for pinned in source.pinned):
            return folder
    raise MissingSource(
        f"{source.name}'s test files are not here: put {', '.join(p.path for p in source.pinned)} (from "
        f"{source.repository} at the commits in hfstack/sources.py) under {candidates[-1]}, e.g. with "
        f"`scripts/hfstack --import-{source.name} CHECKOUT`"
    )


def file_digests(work: Path, source: Source) -> dict[str, str]:
    """sha256 of each pinned file as it is in the work folder (recorded with the results)."""
    return {p.path: hashlib.sha256((work / p.path).read_bytes()).hexdigest() for p in source.pinned}


def prepare_work(cache: Path, source: Source, side: str, sources_dir: Path | None = None) -> Path:
    """A fresh work folder for one source and side: its tests as released, nothing edited."""
    work = cache / "work" / side / source.name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if source.pinned:
        folder = pinned_folder(cache, source, sources_dir)
        for pinned in source.pinned:
            target = work / pinned.path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / pinned.path, target)
        # the files import each other relatively (`from .trainer_test_utils import ...`): make them a package
        for package in {Path(p.path).parent for p in source.pinned}:
            for parent in (package, *package.parents):
                if parent != Path("."):
                    (work / parent / "__init__.py").touch()
        return work
    root = extract_sdist(cache, source.name, source.version, source.sdist_sha256)
    shutil.copytree(root / "tests", work / "tests")
    # The files import each other relatively (`from .testing_utils import ...`); the repositories have a
    # tests/__init__.py that the sdists leave out (peft's only holds a debugging switch).
    (work / "tests" / "__init__.py").touch()
    if (root / "pyproject.toml").is_file():  # the library's own pytest settings (markers, warning filters)
        shutil.copy(root / "pyproject.toml", work / "pyproject.toml")
    return work


def import_pinned(source: Source, checkout: Path, cache: Path, sources_dir: Path | None = None) -> Path:
    """Fill the sources folder from a git checkout of the source's repository, file by pinned commit."""
    target = sources_dir or cache / "sources" / source.name
    for pinned in source.pinned:
        done = subprocess.run(
            ["git", "-C", str(checkout), "show", f"{pinned.commit}:{pinned.path}"], capture_output=True
        )
        if done.returncode != 0:
            raise SystemExit(
                f"hfstack: {checkout} has no {pinned.path} at {pinned.commit}: {done.stderr.decode().strip()}"
            )
        path = target / pinned.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(done.stdout)
        digest = hashlib.sha256(done.stdout).hexdigest()
        note = (
            ""
            if digest == pinned.sha256
            else f" (sha256 {digest[:16]}, the recorded run had {pinned.sha256[:16]})"
        )
        print(f"hfstack: {pinned.path} @ {pinned.commit[:12]} -> {path}{note}")
    return target
