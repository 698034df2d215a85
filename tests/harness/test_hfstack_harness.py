"""The harness that runs the Hugging Face stack's own tests (hfstack/): how it tells hub-dependent tests apart,
what its start-up folder does to a process (network guard, ``accelerate`` alias, blocker probes), where the
test files come from, and the table it writes. The suites themselves run through scripts/hfstack, not here."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY))

from hfstack import run, sources, table  # noqa: E402
from peer.run import read_known_failures, write_known_failures  # noqa: E402


def test_a_test_that_tried_the_network_or_says_the_hub_is_missing_counts_as_hub(tmp_path):
    log = tmp_path / "network.log"
    log.write_text("tests/test_a.py::Outer::Inner::test_net\n")
    tests = {
        "tests/test_a.py::Outer.Inner::test_net": {"outcome": "failed", "message": "AssertionError"},
        "tests/test_a.py::T::test_offline": {
            "outcome": "failed",
            "message": "OSError: We couldn't connect to 'https://huggingface.co' to load the files",
        },
        "tests/test_a.py::T::test_real_failure": {"outcome": "failed", "message": "AssertionError: 1 != 2"},
        "tests/test_a.py::T::test_passed_after_trying": {"outcome": "passed", "message": ""},
    }
    log.write_text(log.read_text() + "tests/test_a.py::T::test_passed_after_trying\n")
    run.classify(tests, log)
    assert {test: result["outcome"] for test, result in tests.items()} == {
        "tests/test_a.py::Outer.Inner::test_net": "hub",
        "tests/test_a.py::T::test_offline": "hub",
        "tests/test_a.py::T::test_real_failure": "failed",
        "tests/test_a.py::T::test_passed_after_trying": "passed",
    }
    assert tests["tests/test_a.py::T::test_offline"]["ran_as"] == "failed"


def _start_up(tmp_path: Path, **variables: str) -> dict[str, str]:
    """A process environment with the harness's start-up folder first on PYTHONPATH."""
    folder = tmp_path / "startup"
    shutil.copytree(REPOSITORY / "hfstack" / "startup", folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HFSTACK_", "PYTHON"))}
    return {**env, "PYTHONPATH": str(folder), **variables}


def test_the_network_guard_refuses_other_hosts_at_once_and_logs_the_test(tmp_path):
    log = tmp_path / "network.log"
    code = textwrap.dedent(
        """
        import os, socket, time
        server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
        local = socket.create_connection(server.getsockname(), timeout=5)  # this machine: allowed
        local.close()
        os.environ["PYTEST_CURRENT_TEST"] = "tests/test_x.py::T::test_hub (call)"
        start = time.monotonic()
        for attempt in (lambda: socket.getaddrinfo("huggingface.co", 443),
                        lambda: socket.socket().connect(("203.0.113.7", 443))):
            try:
                attempt()
            except OSError as error:
                print(type(error).__name__, "no network" in str(error))
        print("seconds", round(time.monotonic() - start, 1))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_start_up(tmp_path, HFSTACK_NETWORK_LOG=str(log)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["gaierror True", "ConnectionRefusedError True"]
    assert float(lines[2].split()[1]) < 5
    assert log.read_text().splitlines() == ["tests/test_x.py::T::test_hub"] * 2


def test_the_hub_clients_retry_pause_is_skipped(tmp_path):
    pytest.importorskip("huggingface_hub")
    code = textwrap.dedent(
        """
        import time
        from huggingface_hub.utils import _http
        start = time.monotonic()
        _http.time.sleep(30)
        print(round(time.monotonic() - start, 1), _http.time.monotonic() > 0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_start_up(tmp_path, HFSTACK_NETWORK_LOG=str(tmp_path / "log")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seconds, clock = done.stdout.split()
    assert float(seconds) < 5 and clock == "True"


def test_the_alias_serves_drivetrains_modules_and_works_around_the_blockers(tmp_path):
    code = textwrap.dedent(
        """
        import json
        import accelerate, accelerate.utils, accelerate.big_modeling
        import drivetrain, drivetrain.utils, drivetrain.big_modeling
        from accelerate.utils import TorchDynamoPlugin, get_max_memory
        budget = {"cpu": "300KB"}
        get_max_memory(budget)
        print(json.dumps({
            "same": [accelerate is drivetrain, accelerate.utils is drivetrain.utils,
                     accelerate.big_modeling is drivetrain.big_modeling,
                     accelerate.Accelerator is drivetrain.Accelerator],
            "dynamo": str(TorchDynamoPlugin(backend=None, mode=None).backend),
            "budget": budget["cpu"],
        }))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_start_up(tmp_path, HFSTACK_ALIAS="1", HFSTACK_PATCH_BLOCKERS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["same"] == [True, True, True, True]
    assert found["dynamo"].upper().endswith("NO")  # no ACCELERATE_DYNAMO_BACKEND: compilation off
    assert found["budget"] == 300_000  # converted in place, as Accelerate's get_max_memory does


def test_transformers_files_come_from_the_sources_folder_as_a_package(tmp_path):
    source = sources.SOURCES["transformers"]
    with pytest.raises(sources.MissingSource, match="--import-transformers"):
        sources.pinned_folder(tmp_path, source, tmp_path / "empty")
    folder = tmp_path / "files"
    for pinned in source.pinned:
        (folder / pinned.path).parent.mkdir(parents=True, exist_ok=True)
        (folder / pinned.path).write_text(f"# {pinned.commit}\n")
    work = sources.prepare_work(tmp_path / "cache", source, "drivetrain", folder)
    assert (work / "tests" / "__init__.py").is_file() and (
        work / "tests" / "trainer" / "__init__.py"
    ).is_file()
    digests = sources.file_digests(work, source)
    assert set(digests) == {p.path for p in source.pinned} and all(len(d) == 64 for d in digests.values())


def test_every_source_names_its_files_and_pins_what_it_installs():
    for source in sources.SOURCES.values():
        assert set(source.fast) <= set(source.files)
        assert source.provenance
        assert all("==" in requirement for requirement in source.requirements)
        assert not any(r.startswith(("accelerate", "torch")) for r in source.requirements)
        assert bool(source.pinned) != bool(source.sdist_sha256)


def test_known_failures_keep_their_reason_when_rewritten(tmp_path):
    listing = tmp_path / "known_failures.txt"
    listing.write_text(
        "# header\npeft:tests/test_a.py::T::test_x  # drivetrain lacks X\npeft:tests/test_a.py::T::test_y  # gone\n"
        "trl:tests/test_b.py::test_z  # not run this time\n"
    )
    write_known_failures(
        ["peft:tests/test_a.py::T::test_x", "peft:tests/test_a.py::T::test_new"],
        {"peft:tests/test_a.py"},
        listing,
        ["# new header"],
        run._covered_by,
    )
    assert read_known_failures(listing) == {
        "peft:tests/test_a.py::T::test_x": "drivetrain lacks X",
        "peft:tests/test_a.py::T::test_new": "",
        "trl:tests/test_b.py::test_z": "not run this time",
    }
    assert listing.read_text().startswith("# new header\n")


def test_the_table_counts_what_is_kept_and_explains_what_is_not():
    reference = {
        "sources": {
            "peft": {
                "files": {
                    "tests/test_a.py": {
                        "seconds": 1.0,
                        "tests": {
                            "tests/test_a.py::T::test_ok": {"outcome": "passed"},
                            "tests/test_a.py::T::test_lost": {"outcome": "passed"},
                            "tests/test_a.py::T::test_hub": {"outcome": "hub", "message": "offline"},
                        },
                    }
                }
            }
        }
    }
    ours = {
        "served_by": "alias",
        "sources": {
            "peft": {
                "accelerate": {"patched": ["get_max_memory(in place)"]},
                "files": {
                    "tests/test_a.py": {
                        "seconds": 2.0,
                        "tests": {
                            "tests/test_a.py::T::test_ok": {"outcome": "passed"},
                            "tests/test_a.py::T::test_lost": {
                                "outcome": "failed",
                                "message": "AttributeError: x",
                            },
                            "tests/test_a.py::T::test_hub": {"outcome": "hub", "message": "offline"},
                        },
                    }
                },
            }
        },
    }
    page = table.render(reference, ours, {"peft:tests/test_a.py::T::test_lost": "drivetrain lacks x"})
    assert "| peft | `tests/test_a.py` | 2 / 0 / 0 / 1 | 1 / 1 / 0 / 1 | 1 of 2 | 1.0 / 2.0 |" in page
    assert "| **all** | **1 of 2 (50.0%)**: target 98% not met |" in page
    assert "| `peft:tests/test_a.py::T::test_lost` | failed | drivetrain lacks x |" in page
    assert "`get_max_memory(in place)`" in page
    assert table.kept(reference, {"peft": ours["sources"]["peft"]["files"]}) == (1, 2)


def test_loopback_is_what_the_guard_lets_through():
    from importlib import util

    spec = util.spec_from_file_location("guard", REPOSITORY / "hfstack" / "startup" / "hfstack_network.py")
    guard = util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    assert all(
        guard._is_local(host) for host in ("localhost", "127.0.0.1", "127.8.9.1", "::1", "[::1]", None, "")
    )
    assert not any(
        guard._is_local(host) for host in ("huggingface.co", "10.0.0.1", "203.0.113.7", "::ffff:1.2.3.4")
    )
    assert socket.getaddrinfo is not guard._getaddrinfo  # loading the module installs nothing
