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
#: flat-dp, the second backend written from the docs alone (README.md there); its broken copies are in broken/
NEWCOMER = HERE / "newcomer" / "flat_dp.py"
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
    "unconsolidated_save.py": (
        ("checkpoint_resume", "checkpoint_portable", "checkpoint_per_process_state"),
        2,
        "consolidat",
    ),
    "shard_saved_as_whole.py": (("checkpoint_resume", "checkpoint_per_process_state"), 2, "shard"),
    # flat-dp's deliberately broken copies: the eight mistakes of issue 30, tried on a backend written from the
    # docs. The first two were caught by no property before prepare_synchronises_weights and
    # checkpoint_per_process_state; summing without dividing is caught by one property on purpose.
    "flat_dp_no_broadcast.py": (
        ("prepare_synchronises_weights",),
        2,
        "wrap_model must broadcast the parameters and buffers from process 0",
    ),
    "flat_dp_broadcast_from_last.py": (
        ("prepare_synchronises_weights",),
        2,
        "but not process 0's initial ones",
    ),
    "flat_dp_own_view_saved.py": (
        ("checkpoint_per_process_state",),
        2,
        "written by the main process only (every process wrote its own view",
    ),
    "flat_dp_summed.py": (
        ("multi_process_matches_combined_batch",),
        2,
        "summed over the processes: average them",
    ),
    "flat_dp_averaged_in_step.py": (
        ("adamw_schedule_matches_local", "no_sync", "checkpoint_portable"),
        2,
        {
            "adamw_schedule_matches_local": "averaged by the end of the synchronised backward",
            "no_sync": "averaged by the end of the synchronised backward",
            "checkpoint_portable": "adamw_schedule_matches_local, whose training this resumes, fails too",
        },
    ),
    "flat_dp_no_sync_ignored.py": (("no_sync",), 2, "inside no_sync()"),
    "flat_dp_joinable.py": (("join_uneven_inputs",), 2, "not a torch Joinable"),
    "flat_dp_first_model_only.py": (
        ("no_sync",),
        2,
        "after the synchronised backward that follows no_sync()",
    ),
    "flat_dp_unscaled_backward.py": (
        ("multi_process_matches_combined_batch", "adamw_schedule_matches_local"),
        2,
        "scaler.scale(loss",
    ),
}
#: A broken copy that deadlocks: run alone with a short per-property limit (a hang costs the whole limit).
DEADLOCK = BROKEN / "flat_dp_deadlock.py"
DEADLOCK_LIMIT_S = 30.0


@pytest.fixture(scope="module", autouse=True)
def _newcomer_importable():
    """flat-dp's broken copies import it by its module name: here (the suite loads a backend to check its
    hooks) and in the processes the suite launches."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(NEWCOMER.parent))
        patch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [str(NEWCOMER.parent), os.environ.get("PYTHONPATH")]))
        )
        yield


#: every backend in plugins/ that can run here (the kernel's local first); contrib/ backends test themselves
REPOSITORY_BACKENDS = repository_backends(REPOSITORY, ("plugins",))

#: Known, open failures: strict, so the test turns red the day the backend is fixed and this entry must go.
KNOWN_FAILURES: dict[tuple[str, int], str] = {}


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
        str(NEWCOMER),
        *REPOSITORY_BACKENDS,
    ]
    return run_suite(targets, processes=1, workdir=str(tmp_path_factory.mktemp("one")))


@pytest.fixture(scope="module")
def two_processes(rendered_template, tmp_path_factory):
    targets = [
        *_broken(2),
        str(rendered_template / "drivetrain_fresh_backend" / "plugin.py"),
        str(NEWCOMER),
        *REPOSITORY_BACKENDS,
    ]
    return run_suite(targets, processes=2, workdir=str(tmp_path_factory.mktemp("two")))


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
    (never only a torch error): ``words`` in every one, or per property."""
    properties, _, words = BROKEN_BACKENDS[name]
    assert report.failed == list(properties), report.format()
    for verdict in report.verdicts:
        if verdict.property in properties:
            expected = words if isinstance(words, str) else words[verdict.property]
            assert expected in verdict.reason, report.format()


@pytest.mark.parametrize("name", [n for n, (_, p, _) in BROKEN_BACKENDS.items() if p == 1])
def test_broken_backend_fails_exactly_its_property_in_one_process(one_process, name):
    _assert_caught(one_process[str(BROKEN / name)], name)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", [n for n, (_, p, _) in BROKEN_BACKENDS.items() if p == 2])
def test_broken_backend_fails_exactly_its_property_in_two_processes(two_processes, name):
    _assert_caught(two_processes[str(BROKEN / name)], name)


def test_newcomer_backend_passes_in_one_process(one_process):
    """flat-dp, written from the docs alone, passes every property with one process (its hooks then hand
    everything to the reference backend)."""
    report = one_process[str(NEWCOMER)]
    assert report.ok, report.format()
    assert report.status("one_process_matches_local") == "pass", report.format()


@pytest.mark.multiprocess
def test_newcomer_backend_passes_in_two_processes(two_processes):
    """With two processes flat-dp does its own work: broadcast at wrap, one flat all-reduce per synchronised
    backward, no_sync for accumulation; every applicable property passes, the new ones included."""
    report = two_processes[str(NEWCOMER)]
    assert report.ok, report.format()
    for name in (
        "multi_process_matches_combined_batch",
        "prepare_synchronises_weights",
        "adamw_schedule_matches_local",
        "no_sync",
        "checkpoint_portable",
        "checkpoint_per_process_state",
    ):
        assert report.status(name) == "pass", report.format()
    assert "diverged weights" in next(
        v.reason for v in report.verdicts if v.property == "checkpoint_per_process_state"
    ), report.format()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_deadlocked_backend_is_reported_with_where_each_process_waits_and_the_suite_goes_on(tmp_path):
    """A hang is a finding: flat-dp whose all-reduce receives before it sends deadlocks in collectives. The
    verdict arrives (streamed) as soon as the limit passes, names the property, each process's collective and
    the check's line, carries the stacks; the next launch judges every other property."""
    streamed = []
    report = run_suite(
        [str(DEADLOCK)],
        processes=2,
        timeout=DEADLOCK_LIMIT_S,
        workdir=str(tmp_path),
        on_verdict=lambda target, verdict, seconds: streamed.append(
            (verdict.property, verdict.status, seconds)
        ),
    )[str(DEADLOCK)]
    assert report.failed == ["collectives"], report.format()
    verdict = next(v for v in report.verdicts if v.property == "collectives")
    assert verdict.reason.startswith(f"timed out after {DEADLOCK_LIMIT_S:g} s (the per-property limit"), (
        verdict.reason
    )
    for rank in (0, 1):
        assert f"rank {rank}: in reduce (accelerator.py:" in verdict.reason, verdict.reason
    assert verdict.reason.count("waiting in torch.distributed's recv") == 2, verdict.reason
    assert verdict.reason.count("in the backend's all_reduce (flat_dp_deadlock.py:") == 2, verdict.reason
    assert "called from checks.py:" in verdict.reason and "in collectives" in verdict.reason
    assert "flat_dp_deadlock.py" in verdict.stacks and "rank 1, main thread" in verdict.stacks
    # streamed in order: the hang as soon as it was found, before the properties that run after it
    order = [prop for prop, _, _ in streamed]
    assert ("collectives", "FAIL", DEADLOCK_LIMIT_S) in streamed
    assert order.index("collectives") < order.index("dataloader_modes") < order.index("clean_exit")
    statuses = _statuses(report)
    assert statuses["dataloader_modes"] == statuses["second_accelerator"] == statuses["clean_exit"] == "pass"


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
        "from drivetrain.contract.registry import PluginInfo\nPLUGIN_INFO = PluginInfo(kind='backend', "
        "contract='2.0')\n"
    )
    problem, info = check_spec(str(plugin))
    assert info is None
    from drivetrain.plugin_api import CONTRACT_VERSION

    assert f"implements contract 2.0, but this drivetrain implements contract {CONTRACT_VERSION}" in problem


def test_joinable_needs_several_processes(tmp_path):
    plugin = tmp_path / "joinable_alone.py"
    plugin.write_text(
        "from drivetrain.plugin_api import Capabilities, PluginInfo\nPLUGIN_INFO = PluginInfo(kind='backend', "
        "capabilities=Capabilities(joinable=True))\n"
    )
    problem, info = check_spec(str(plugin))
    assert info is not None and "capabilities.joinable=True with multi_process=False" in problem


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
    # each verdict also streamed on stderr as it came, with its duration for the properties that ran
    streamed = [line for line in result.stderr.splitlines() if line.startswith("[dirty-exit, 1p] ")]
    assert len(streamed) == len(PROPERTIES), result.stderr
    assert "[dirty-exit, 1p] pass collectives (" in result.stderr
    assert "[dirty-exit, 1p] FAIL clean_exit: exit code 3" in result.stderr


def test_cli_timeout_must_be_positive():
    result = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "conformance", "local", "--timeout", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--timeout must be more than 0 seconds, got 0" in result.stderr
    assert result.stderr.count("\n") == 1


def test_cli_refuses_a_precision_plugin_the_suite_has_no_reference_for():
    """fp8 acts only for mixed_precision='fp8' (no reference run): named with --plugins it would convert every
    run, so the suite refuses it in one line instead of failing six properties."""
    result = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "conformance", "local", "--plugins", "fp8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--plugins: plugin 'fp8' provides mixed_precision fp8, for which the suite has no reference" in (
        result.stderr
    )
    assert result.stderr.count("\n") == 1


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
