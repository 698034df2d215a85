"""The conformance suite itself: our backends pass, and a backend broken in one way fails exactly the property
it breaks. Backends are batched into one launch per process count (a launch costs seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain_conformance import PROPERTIES, run_suite
from drivetrain_conformance.discover import repository_backends
from drivetrain_conformance.static import check_spec

HERE = Path(__file__).parent
BROKEN = HERE / "broken"
REPOSITORY = HERE.parents[1]
TEMPLATE = REPOSITORY / "contrib" / "plugin-template"

#: broken backend file -> (the properties it breaks, processes needed to see it, words of the failure reason
#: that name the mistake). All of one process count run in one launch (a launch costs seconds).
BROKEN_BACKENDS = {
    "unmarked_hook.py": (("hooks_match_spec",), 1, "lacks @hookimpl"),
    "autocast_dtype.py": (("adamw_schedule_matches_local", "autocast"), 1, "autocast"),
    "autocast_ignored.py": (("adamw_schedule_matches_local", "autocast"), 1, "autocast"),
    "accumulation_rescaled.py": (("gradient_accumulation",), 1, "full batches"),
    "state_not_restored.py": (("checkpoint_resume", "checkpoint_portable"), 1, "load_state does not restore"),
    "unwrap_stale.py": (("unwrap_model",), 1, "unwrapped"),
    "teardown_previous.py": (("second_accelerator",), 1, "torn down"),
    "scheduler_unbound.py": (
        ("adamw_schedule_matches_local",),
        1,
        "bind schedulers to the wrapped optimizer",
    ),
    "gather_reversed.py": (("collectives",), 2, "gather (rank order"),
    "grads_summed.py": (("multi_process_matches_combined_batch",), 2, "summed over the processes: average"),
    "no_sync_ignored.py": (("no_sync",), 2, "inside no_sync()"),
    "unsharded_loader.py": (("dataloader_modes",), 2, "its own share of every batch"),
    "rng_unsynchronised.py": (("dataloader_modes",), 2, "random state is not synchronised"),
    "unconsolidated_save.py": (("checkpoint_resume", "checkpoint_portable"), 2, "consolidat"),
    "shard_saved_as_whole.py": (("checkpoint_resume",), 2, "shard"),
}


@pytest.fixture(scope="module", autouse=True)
def _megatron_without_default_clipping():
    """The megatron backend clips gradients to 1.0 in its optimizer step by default (Accelerate's default);
    the oracle does not clip, so the processes this module launches turn that off (Accelerate's variable).
    Module-scoped and undone after: other tests' megatron runs keep the default."""
    with pytest.MonkeyPatch.context() as patch:
        if "MEGATRON_LM_GRADIENT_CLIPPING" not in os.environ:
            patch.setenv("MEGATRON_LM_GRADIENT_CLIPPING", "0")
        yield


#: every backend in plugins/ that can run here (the kernel's local first); contrib/ backends test themselves
REPOSITORY_BACKENDS = repository_backends(REPOSITORY, ("plugins",))

#: Known, open failures: strict, so the test turns red the day the backend is fixed and this entry must go.
_DEEPSPEED_CLIPS_BY_CONFIG = (
    "deepspeed clips by its config's gradient_clipping, not in accelerator.clip_grad_norm_ (as Accelerate does): "
    "adamw_schedule_matches_local reports that the weights equal training without clipping"
)
KNOWN_FAILURES: dict[tuple[str, int], str] = {
    ("deepspeed", 1): _DEEPSPEED_CLIPS_BY_CONFIG,
    ("deepspeed", 2): _DEEPSPEED_CLIPS_BY_CONFIG,
}


def _with_known_failures(processes: int) -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[(name, processes)]))
        if (name, processes) in KNOWN_FAILURES
        else name
        for name in REPOSITORY_BACKENDS
    ]


def _broken(processes: int) -> list[str]:
    return [str(BROKEN / name) for name, (_, needed, _) in BROKEN_BACKENDS.items() if needed == processes]


@pytest.fixture(scope="module")
def rendered_template(tmp_path_factory) -> Path:
    from cookiecutter.main import cookiecutter

    output = tmp_path_factory.mktemp("rendered")
    project = cookiecutter(
        str(TEMPLATE), no_input=True, output_dir=str(output), extra_context={"plugin_name": "fresh-backend"}
    )
    return Path(project)


@pytest.fixture(scope="module")
def one_process(rendered_template, tmp_path_factory):
    # Ours and the broken ones first: a backend that hangs the launch is last and takes only itself down.
    targets = [
        *_broken(1),
        str(rendered_template / "drivetrain_fresh_backend" / "plugin.py"),
        *REPOSITORY_BACKENDS,
    ]
    return run_suite(targets, processes=1, workdir=str(tmp_path_factory.mktemp("one")), timeout=300)


@pytest.fixture(scope="module")
def two_processes(rendered_template, tmp_path_factory):
    targets = [
        *_broken(2),
        str(rendered_template / "drivetrain_fresh_backend" / "plugin.py"),
        *REPOSITORY_BACKENDS,
    ]
    return run_suite(targets, processes=2, workdir=str(tmp_path_factory.mktemp("two")), timeout=300)


def _statuses(report) -> dict[str, str]:
    return {v.property: v.status for v in report.verdicts}


@pytest.mark.parametrize("name", _with_known_failures(1))
def test_repository_backend_passes_in_one_process(one_process, name):
    report = one_process[name]
    assert report.ok, report.format()
    statuses = _statuses(report)
    assert statuses["one_process_matches_local"] == "pass"
    assert statuses["multi_process_matches_combined_batch"] == "n/a"
    assert [v.property for v in report.verdicts] == [p.name for p in PROPERTIES]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", _with_known_failures(2))
def test_repository_backend_passes_in_two_processes(two_processes, name):
    report = two_processes[name]
    assert report.ok, report.format()
    if name == "local":  # one process only: every run-time property is n/a, with the reason
        assert {v.status for v in report.verdicts[1:]} == {"n/a"}
        assert "multi_process=False" in report.verdicts[1].reason
    else:
        assert _statuses(report)["multi_process_matches_combined_batch"] == "pass", report.format()


def _assert_caught(report, name: str) -> None:
    """The broken backend fails exactly the properties meant to catch it, each reason naming the mistake
    (never only a torch error)."""
    properties, _, words = BROKEN_BACKENDS[name]
    assert report.failed == list(properties), report.format()
    for verdict in report.verdicts:
        if verdict.property in properties:
            assert words in verdict.reason, report.format()


@pytest.mark.parametrize("name", [n for n, (_, p, _) in BROKEN_BACKENDS.items() if p == 1])
def test_broken_backend_fails_exactly_its_property_in_one_process(one_process, name):
    _assert_caught(one_process[str(BROKEN / name)], name)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", [n for n, (_, p, _) in BROKEN_BACKENDS.items() if p == 2])
def test_broken_backend_fails_exactly_its_property_in_two_processes(two_processes, name):
    _assert_caught(two_processes[str(BROKEN / name)], name)


def test_rendered_template_is_a_ready_package(rendered_template, one_process):
    pyproject = (rendered_template / "pyproject.toml").read_text()
    assert '"fresh-backend" = "drivetrain_fresh_backend.plugin"' in pyproject
    assert (rendered_template / "tests" / "test_conformance.py").read_text().count('"fresh-backend"') == 1
    assert (rendered_template / "README.md").exists()
    report = one_process[str(rendered_template / "drivetrain_fresh_backend" / "plugin.py")]
    assert report.ok, report.format()


@pytest.mark.multiprocess
def test_rendered_template_passes_the_multi_process_suite(rendered_template, two_processes):
    report = two_processes[str(rendered_template / "drivetrain_fresh_backend" / "plugin.py")]
    assert report.ok, report.format()
    for name in (
        "multi_process_matches_combined_batch",
        "adamw_schedule_matches_local",
        "checkpoint_portable",
    ):
        assert report.status(name) == "pass", report.format()


def test_rendered_template_registers_its_pytest_marks(rendered_template):
    """The rendered package's tests collect under --strict-markers: multiprocess/slow are registered."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "--strict-markers",
            "-p",
            "no:cacheprovider",
        ],
        cwd=rendered_template,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 tests collected" in result.stdout and "PytestUnknownMarkWarning" not in result.stdout


def test_contract_version_mismatch_is_a_clear_failure(tmp_path):
    plugin = tmp_path / "future_backend.py"
    plugin.write_text(
        "from drivetrain.contract.manager import PluginInfo\nPLUGIN_INFO = PluginInfo(kind='backend', "
        "contract='2.0')\n"
    )
    problem, info = check_spec(str(plugin))
    assert info is None
    from drivetrain.plugin_api import CONTRACT_VERSION

    assert f"implements contract 2.0, but this drivetrain implements contract {CONTRACT_VERSION}" in problem


def test_cli_prints_one_verdict_per_property_and_fails_on_a_dirty_exit(tmp_path):
    """`drivetrain conformance FILE`: exit code 1, clean_exit FAIL with the reason, the rest pass."""
    result = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "conformance", str(BROKEN / "dirty_exit.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = {
        line.split()[1]: line.split()[0]
        for line in result.stdout.splitlines()
        if line.startswith("  ") and len(line.split()) >= 2
    }
    assert lines["clean_exit"] == "FAIL"
    assert "exit code 3" in result.stdout
    assert [p for p, status in lines.items() if status == "FAIL"] == ["clean_exit"]
    assert len(lines) == len(PROPERTIES)


def test_cli_unknown_backend_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "conformance", "no-such-backend"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "unknown drivetrain plugin 'no-such-backend'" in result.stderr
    assert result.stderr.count("\n") == 1


SHRINKER = """
import torch
from drivetrain import hookimpl
from drivetrain.plugin_api import PluginInfo

PLUGIN_INFO = PluginInfo(kind="feature", description="halves every weight at prepare (changes training)")


@hookimpl
def wrap_model(model):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.5)
"""


def test_plugins_reach_every_checked_accelerator_and_not_the_oracle(tmp_path, monkeypatch):
    """`--plugins NAME`: a feature plugin that changes training is named by the checked Accelerators (so
    training no longer matches the reference backend) while the oracle stays the reference backend alone."""
    from drivetrain.testing import install_plugin_for_test

    env = install_plugin_for_test(tmp_path / "site", "shrinker", SHRINKER)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the launched processes discover it
    (tmp_path / "run").mkdir()
    report = run_suite(["local"], processes=1, workdir=str(tmp_path / "run"), plugins=("shrinker",))["local"]
    statuses = _statuses(report)
    assert statuses["one_process_matches_local"] == "FAIL"
    assert statuses["collectives"] == statuses["checkpoint_resume"] == "pass"
    assert report.format().splitlines()[0] == (
        "drivetrain conformance: backend 'local' with plugins shrinker, 1 process(es)"
    )
    assert report.to_json()["plugins"] == ["shrinker"]


def test_new_plugin_renders_what_cookiecutter_renders(rendered_template, tmp_path):
    """`drivetrain new-plugin NAME` (no cookiecutter needed) gives the same files as cookiecutter."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "drivetrain.commands.main",
            "new-plugin",
            "fresh-backend",
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    created = tmp_path / "drivetrain-fresh-backend"
    assert f"created {created}" in result.stdout

    def files(root: Path) -> dict[str, str]:
        # what other tests leave in the rendered copy by running it (bytecode, pytest's cache, egg-info) is not
        # part of what the template renders
        def made_by_a_run(path: Path) -> bool:
            return any(
                part in ("__pycache__", ".pytest_cache") or part.endswith(".egg-info")
                for part in path.relative_to(root).parts
            )

        return {
            str(p.relative_to(root)): p.read_text()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not made_by_a_run(p)
        }

    assert files(created) == files(rendered_template)
    again = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "new-plugin", "Bad_Name"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2
    assert "plugin name 'Bad_Name' is not valid" in again.stderr and again.stderr.count("\n") == 1
