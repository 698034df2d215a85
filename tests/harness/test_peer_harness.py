"""The peer suite's harness (peer/): the one rename it applies to the reference's tests, its junit reading and
its not-applicable list. The suite itself runs through scripts/peer, not here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY))

from peer import junit, rename, run  # noqa: E402


def test_rename_changes_package_names_only():
    source = """import accelerate
import accelerate.commands.env as accelerate_env_cmd
from accelerate.utils import patch_environment, path_in_accelerate_package
from accelerate import Accelerator

command = ["accelerate", "launch"]
target = "accelerate.utils.launch.which"
code = "import accelerate, accelerate.utils.transformer_engine"
folder = Path.home() / ".cache/huggingface/accelerate"
env = {"ACCELERATE_MIXED_PRECISION": "no", "accelerate_num_processes": 2}
label = "`accelerate` bash location"
url = "https://github.com/huggingface/accelerate/pull/2369"
job = "accelerate-sagemaker-1"
install = f"pip install accelerate -U {accelerate.__version__}"
"""
    renamed, replacements = rename.rename_source(source)
    assert (
        renamed
        == """import drivetrain
import drivetrain.commands.env as accelerate_env_cmd
from drivetrain.utils import patch_environment, path_in_accelerate_package
from drivetrain import Accelerator

command = ["drivetrain", "launch"]
target = "drivetrain.utils.launch.which"
code = "import drivetrain, drivetrain.utils.transformer_engine"
folder = Path.home() / ".cache/huggingface/accelerate"
env = {"ACCELERATE_MIXED_PRECISION": "no", "accelerate_num_processes": 2}
label = "`accelerate` bash location"
url = "https://github.com/huggingface/accelerate/pull/2369"
job = "accelerate-sagemaker-1"
install = f"pip install accelerate -U {drivetrain.__version__}"
"""
    )
    assert [r.kind for r in replacements].count("name") >= 4  # f-strings tokenize differently from 3.12
    assert len(replacements) == 8


def test_rename_keeps_a_multiline_string_and_its_neighbours_intact():
    source = 'x = """\nfrom accelerate.state import PartialState\nsee accelerate docs\n"""; y = accelerate\n'
    renamed, _ = rename.rename_source(source)
    assert (
        renamed
        == 'x = """\nfrom drivetrain.state import PartialState\nsee accelerate docs\n"""; y = drivetrain\n'
    )


def test_junit_ids_match_on_both_sides(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_x.UtilsTester" name="test_a" time="0.5"/>
<testcase classname="tests.test_x" name="test_b[1]" time="0.1"><skipped message="requires CUDA"/></testcase>
<testcase classname="tests.test_x.UtilsTester" name="test_c" time="0.2">
<failure message="AssertionError: 0.8 != 0.9">E AssertionError: 0.8 != 0.9</failure></testcase>
<testcase classname="" name="tests.test_y"><error message="collection failure">ImportError</error></testcase>
</testsuite></testsuites>"""
    )
    results = junit.read(report, "tests/test_x.py")
    assert {k: v["outcome"] for k, v in results.items()} == {
        "tests/test_x.py::UtilsTester::test_a": "passed",
        "tests/test_x.py::test_b[1]": "skipped",
        "tests/test_x.py::UtilsTester::test_c": "failed",
        "tests/test_x.py::<collection>": "failed",
    }
    assert results["tests/test_x.py::UtilsTester::test_c"]["message"] == "AssertionError: 0.8 != 0.9"


@pytest.mark.parametrize(
    "test_id, applies",
    [
        ("tests/test_examples.py::ExampleDifferenceTests::test_nlp_examples", False),
        ("tests/test_utils.py::UtilsTester::test_patch_environment", True),
    ],
)
def test_not_applicable_list_matches_files_classes_and_globs(test_id, applies):
    entries = run.load_not_applicable()
    assert all(entry["reason"].strip() for entry in entries)
    assert (run.not_applicable_reason(test_id, entries) is None) == applies


def test_known_failures_are_tolerated_and_rewritten_for_what_ran(tmp_path, monkeypatch):
    listing = tmp_path / "known_failures.txt"
    listing.write_text(
        "# header\nscript test_ops.py\ntests/test_a.py::T::test_old  # fixed now\ntests/test_b.py::T::test_x\n"
    )
    monkeypatch.setattr(run, "KNOWN_FAILURES", listing)
    assert run.load_known_failures() == {
        "script test_ops.py",
        "tests/test_a.py::T::test_old",
        "tests/test_b.py::T::test_x",
    }
    # A run over test_ops.py and tests/test_a.py saw test_ops fail and tests/test_a.py::T::test_new fail.
    run.write_known_failures(
        ["script test_ops.py", "tests/test_a.py::T::test_new"], {"test_ops.py", "tests/test_a.py"}
    )
    assert run.load_known_failures() == {
        "script test_ops.py",
        "tests/test_a.py::T::test_new",
        "tests/test_b.py::T::test_x",  # not run: kept
    }


def test_gaps_without_a_diagnostic_run_of_a_file_say_nothing_about_its_tests():
    # results/ is git-ignored: a checkout that never ran --diagnose must not rank every test "not collected".
    from peer import gaps

    reference = {
        "files": {"tests/test_a.py": {"tests": {"tests/test_a.py::T::test_x": {"outcome": "passed"}}}}
    }
    ours = {"files": {"tests/test_a.py": {"tests": {"tests/test_a.py::T::test_x": {"outcome": "failed"}}}}}
    assert gaps.failure_gaps(reference, {}, ours, set())["groups"] == {}
    diagnosed = {"files": {"tests/test_a.py": {"tests": {}}}}  # ran, and did not collect the test
    groups = gaps.failure_gaps(reference, diagnosed, ours, set())["groups"]
    assert [key[0] for key in groups] == ["not collected here"]
