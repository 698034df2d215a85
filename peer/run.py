#!/usr/bin/env python
"""The peer suite: the reference's (Accelerate's) own released tests, run against drivetrain with the package
name renamed, counted beside the same tests run against the reference on this machine. See peer/README.md.

    python peer/run.py --fast                   # the multi-process scripts + the fast unit files (CI's subset)
    python peer/run.py --scripts                # the multi-process scripts only
    python peer/run.py --unit tests/test_utils.py tests/test_hooks.py
    python peer/run.py --all                    # every script and unit file; regenerates docs/peer-suite.md
    python peer/run.py --all --reference        # the same against the reference: peer/reference_counts.json
    python peer/run.py --all --diagnose         # missing names deferred to first use (diagnostic only)
    python peer/run.py --gaps                   # peer/GAPS.md from the last full and diagnostic runs
    python peer/run.py --table                  # docs/peer-suite.md from the stored results
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import tomllib

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from peer import junit, source, table  # noqa: E402

PEER = REPOSITORY / "peer"
RESULTS = PEER / "results"
REFERENCE_COUNTS = PEER / "reference_counts.json"
NOT_APPLICABLE = PEER / "not_applicable.toml"
KNOWN_FAILURES = PEER / "known_failures.txt"

# The multi-process scripts, and how the reference's own tests start each on several processes.
SCRIPTS = {
    "test_script.py": "launch",
    "test_sync.py": "launch",
    "test_ops.py": "launch",
    "test_distributed_data_loop.py": "launch",
    "test_ddp_comm_hook.py": "launch",
    "test_notebook.py": "python",  # calls notebook_launcher itself, with ACCELERATE_NUM_PROCESSES processes
    "test_merge_weights.py": "launch",
}
PROCESSES = 2

# Unit files CI runs (`--fast`): 152 of the reference's passing tests in about 3 minutes of the reference's own
# time on 2 cores (peer/reference_counts.json has each file's seconds); the slow files (debug_launcher
# processes, torch.compile, trackers) are left to --all.
FAST_UNIT_FILES = [
    "tests/test_utils.py",
    "tests/test_data_loader.py",
    "tests/test_dataclasses.py",
    "tests/test_state_checkpointing.py",
    "tests/test_hooks.py",
    "tests/test_offload.py",
    "tests/test_optimizer.py",
    "tests/test_kwargs_handlers.py",
    "tests/test_logging.py",
]


def default_cache(harness: str = "peer") -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "drivetrain" / harness


class Side:
    """What differs between a drivetrain run and a reference run: the interpreter, the launcher command and the
    work folder's layout."""

    def __init__(self, name: str, python: Path, work: Path, cache: Path, diagnose: bool = False):
        self.name, self.python, self.work, self.cache, self.diagnose = name, python, work, cache, diagnose
        self.bin = python.parent
        self.cli = self.bin / ("accelerate" if name == "reference" else "drivetrain")

    def env(self, tmp: Path) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("ACCELERATE_", "DRIVETRAIN_", "PYTHON", "PEER_"))
            and key not in ("VIRTUAL_ENV", "PYTEST_ADDOPTS")
        }
        hub = self.cache / "hf-home"
        env.update(
            PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}",
            VIRTUAL_ENV=str(self.bin.parent),
            OMP_NUM_THREADS="1",
            TMPDIR=str(tmp),
            HF_HOME=str(hub),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            WANDB_MODE="offline",
            PYTHONUNBUFFERED="1",
        )
        if self.name == "drivetrain":
            env["PYTHONPATH"] = str(self.work / "site")
            if self.diagnose:
                env["PEER_DEFER_MISSING"] = "1"
        return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_logged(
    command: list[str], cwd: Path, env: dict, timeout: float, log: Path, report: Path | None = None
):
    """Run `command` in its own process group, output to `log`. Returns (exit code or None, note). The whole
    group is killed on timeout, and also when `report` (pytest's junit xml, written as the session ends) has
    been there for 30 s while the process still lingers: some libraries' exit handlers wait forever (clearml's
    offline reporter does)."""
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        seen_report = None
        while process.poll() is None:
            time.sleep(0.5)
            if report is not None and seen_report is None and report.is_file():
                seen_report = time.monotonic()
            lingering = seen_report is not None and time.monotonic() - seen_report > 30
            if lingering or time.monotonic() - start > timeout:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                if lingering:
                    return None, "the tests ended but the process did not exit within 30 s (killed)"
                return None, f"timed out after {timeout:.0f} s"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers a launcher left behind
    return process.returncode, ""


def run_script(side: Side, name: str, timeout: float) -> dict:
    script = side.work / "test_utils" / "scripts" / name
    tmp = side.cache / "tmp" / side.name / name.removesuffix(".py")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = side.env(tmp)
    if SCRIPTS[name] == "python":
        env["ACCELERATE_NUM_PROCESSES"] = str(PROCESSES)
        command = [str(side.python), str(script)]
    elif side.name == "reference":
        # `accelerate launch --cpu --num_processes 2` starts one process (its simple launcher; MPI only with a
        # hostfile), so the reference's scripts run under torchrun with the variable `--cpu` sets, which
        # Accelerate reads as multi-CPU (gloo) once WORLD_SIZE > 1.
        env["ACCELERATE_USE_CPU"] = "true"
        command = [str(side.python), "-m", "torch.distributed.run", "--nproc_per_node", str(PROCESSES),
                   "--master_port", str(_free_port()), str(script)]  # fmt: skip
    else:
        command = [str(side.cli), "launch", "--cpu", "--num_processes", str(PROCESSES),
                   "--main_process_port", str(_free_port()), str(script)]  # fmt: skip
    start = time.monotonic()
    log = tmp.parent / f"{tmp.name}.log"
    code, note = run_logged(command, tmp, env, timeout, log)
    seconds = time.monotonic() - start
    outcome = "passed" if code == 0 else "failed"
    message = note or ("" if code == 0 else f"exit code {code}")
    output = log.read_text(errors="replace")
    return {"outcome": outcome, "message": message, "seconds": round(seconds, 1), "tail": tail(output)}


def load_not_applicable() -> list[dict]:
    with open(NOT_APPLICABLE, "rb") as handle:
        entries = tomllib.load(handle).get("not_applicable", [])
    for entry in entries:
        if not entry.get("reason") or not entry.get("test"):
            raise SystemExit(f"peer: every entry of {NOT_APPLICABLE.name} needs `test` and `reason`: {entry}")
    return entries


def not_applicable_reason(test_id: str, entries: list[dict]) -> str | None:
    for entry in entries:
        pattern = entry["test"]
        if test_id == pattern or test_id.startswith(pattern + "::") or fnmatch.fnmatchcase(test_id, pattern):
            return entry["reason"]
    return None


def relabel(files: dict, entries: list[dict]) -> dict:
    """Mark the listed tests not applicable in stored results (the list may have grown since they ran)."""
    for run in files.values():
        for test_id, result in run["tests"].items():
            reason = not_applicable_reason(test_id, entries)
            if reason is None and "ran_as" in result:  # no longer listed
                result["outcome"], result["message"] = result.pop("ran_as"), ""
            if reason is not None and result["outcome"] != "not applicable":
                result["ran_as"] = result["outcome"]
                result["outcome"], result["message"] = "not applicable", reason
        if "counts" in run:
            run["counts"] = count(run["tests"])
    return files


def whole_file_reason(file: str, entries: list[dict]) -> str | None:
    return next((entry["reason"] for entry in entries if entry["test"] == file), None)


def collect_ids(side: Side, file: str) -> list[str]:
    """The test ids pytest collects in `file` (used for files that are not applicable as a whole)."""
    tmp = side.cache / "tmp" / side.name / "collect"
    tmp.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(side.python), "-m", "pytest", file, "--collect-only", "-q", "-p", "no:cacheprovider", "-o",
         "addopts="],
        cwd=side.work, env=side.env(tmp), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return [line.strip() for line in done.stdout.splitlines() if line.startswith(file + "::")]


def run_unit(side: Side, file: str, entries: list[dict], test_timeout: float, file_timeout: float) -> dict:
    """Run one unit file in its own pytest process; returns {"seconds", "tests": {id: result}, "error"}."""
    reason = whole_file_reason(file, entries)
    if reason is not None:
        # drivetrain's side may not even collect the file: its tests are the ones the reference collects.
        known = load_json(REFERENCE_COUNTS).get("files", {}).get(file, {}).get("tests")
        ids = sorted(known) if known and side.name != "reference" else collect_ids(side, file)
        tests = {test_id: {"outcome": "not applicable", "message": reason} for test_id in ids}
        return {"seconds": 0.0, "tests": tests, "error": ""}
    tmp = side.cache / "tmp" / side.name / Path(file).stem
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    report = tmp / "junit.xml"
    command = [
        str(side.python), "-m", "pytest", file, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
        f"--timeout={test_timeout:.0f}", f"--junitxml={report}", "-o", "junit_family=xunit1",
    ]  # fmt: skip
    start = time.monotonic()
    log = tmp / "pytest.log"
    code, note = run_logged(command, side.work, side.env(tmp), file_timeout, log, report=report)
    seconds = time.monotonic() - start
    error = note
    if code not in (0, 1, None) and not report.is_file():
        error = f"pytest exit code {code}: {tail(log.read_text(errors='replace'), 15)}"
    tests = junit.read(report, file) if report.is_file() else {}
    relabel({file: {"tests": tests}}, entries)
    return {"seconds": round(seconds, 1), "tests": tests, "error": error}


def unit_files(work: Path) -> list[str]:
    return sorted(path.relative_to(work).as_posix() for path in (work / "tests").glob("test_*.py"))


def count(tests: dict[str, dict]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "not applicable": 0}
    for result in tests.values():
        counts[result["outcome"]] += 1
    return counts


def reference_venv(cache: Path) -> Path:
    """The reference's virtual environment outside the repository: the same torch and test libraries as the
    project's .venv (requirements-dev.txt, peer/requirements.txt, torchdata), and accelerate at the pin."""
    venv = cache / "ref-venv"
    python = venv / "bin" / "python"
    wanted = "\n".join(
        [
            (REPOSITORY / "requirements-dev.txt").read_text(),
            (PEER / "requirements.txt").read_text(),
            f"{source.REFERENCE}=={source.VERSION}",
        ]
    )
    stamp = venv / "peer-requirements.txt"
    if python.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return python
    print(
        f"peer: building the reference's environment in {venv} (several minutes the first time)", flush=True
    )
    if not python.is_file():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "-r", str(REPOSITORY / "requirements-dev.txt"), "-r", str(PEER / "requirements.txt"),
         f"{source.REFERENCE}=={source.VERSION}"],
        check=True,
    )  # fmt: skip
    subprocess.run([*pip, "--no-deps", "torchdata==0.11.0"], check=True)
    stamp.write_text(wanted)
    return python


def _versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys, torch;"
        "names=['accelerate','drivetrain','transformers','datasets','deepspeed'];"
        "v={n: m.version(n) for n in names if __import__('importlib.util').util.find_spec(n)};"
        "v['torch']=torch.__version__; v['python']=sys.version.split()[0]; print(json.dumps(v))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def store(path: Path, side: Side, scripts: dict, units: dict) -> dict:
    """Merge this run's scripts and files into the stored results (a partial run updates only what it ran)."""
    data = load_json(path)
    data.setdefault("scripts", {}).update(scripts)
    data.setdefault("files", {}).update(units)
    relabel(data["files"], load_not_applicable())
    data["reference"] = f"{source.REFERENCE}=={source.VERSION}"
    data["versions"] = _versions(side.python)
    data["machine"] = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, {PROCESSES} processes"
    )
    data["updated"] = time.strftime("%Y-%m-%d %H:%M:%S")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def slim(units: dict) -> dict:
    """What reference_counts.json keeps of a file's run: the counts and each test's outcome and message."""
    return {
        file: {
            "seconds": run["seconds"],
            "error": run["error"],
            "counts": count(run["tests"]),
            "tests": {
                test_id: {
                    "outcome": r["outcome"],
                    **({"message": r["message"]} if r["outcome"] != "passed" else {}),
                }
                for test_id, r in sorted(run["tests"].items())
            },
        }
        for file, run in units.items()
    }


def side_counts(side: Side, file: str, tests: dict) -> Counter:
    """Counts for a file; on drivetrain's side over the reference's tests (a file that does not import here
    fails every test the reference collects in it)."""
    if side.name == "reference":
        return Counter(count(tests))
    reference = load_json(REFERENCE_COUNTS).get("files", {}).get(file, {}).get("tests", {})
    return table.ours_by_reference(reference, tests)


def import_error(tests: dict) -> str:
    """`does not import: <the error>` when pytest could not import the file."""
    for test_id, result in tests.items():
        if test_id.endswith("::<collection>"):
            errors = [
                line[1:].strip() for line in result.get("detail", "").splitlines() if line.startswith("E ")
            ]
            return f"does not import: {errors[-1] if errors else result['message']}"
    return ""


def regressions(reference: dict, scripts: dict, units: dict) -> list[str]:
    """What passes on the reference and not here."""
    lost = [f"script {name}" for name, r in scripts.items()
            if reference.get("scripts", {}).get(name, {}).get("outcome") == "passed" and r["outcome"] != "passed"]  # fmt: skip
    for file, run in units.items():
        ours = run["tests"]
        for test_id, ref in reference.get("files", {}).get(file, {}).get("tests", {}).items():
            if ref["outcome"] == "passed" and ours.get(test_id, {}).get("outcome") not in ("passed",):
                if ours.get(test_id, {}).get("outcome") != "not applicable":
                    lost.append(test_id)
    return lost


KNOWN_FAILURES_HEADER = [
    "# What passes on the reference (peer/reference_counts.json) and does not pass on drivetrain yet: one",
    "# `script <name>` or unit test id a line. `scripts/peer` exits 1 only on a failure not listed here;",
    "# an entry that passes again is reported so it can be removed. Regenerate after a full run with",
    "# `scripts/peer --all --update-known-failures` (a partial run rewrites only what it ran).",
]


def read_known_failures(path: Path | None = None) -> dict[str, str]:
    """{entry: why}: each entry of a known-failures list with the comment that follows it on its line."""
    path = path or KNOWN_FAILURES
    if not path.is_file():
        return {}
    entries = {}
    for line in path.read_text().splitlines():
        entry, _, why = line.partition("#")
        if entry.strip():
            entries[entry.strip()] = why.strip()
    return entries


def load_known_failures(path: Path | None = None) -> set[str]:
    """Scripts (``script test_x.py``) and test ids that pass on the reference and are known not to pass here
    yet (peer/known_failures.txt): a run fails only on what is not listed, so CI catches regressions while
    the list shrinks."""
    return set(read_known_failures(path))


def write_known_failures(
    lost: list[str], ran: set[str], path: Path | None = None, header: list[str] | None = None, covered_by=None
) -> None:
    """Rewrite the list: entries of what this run covered become exactly what failed; the rest is kept. An
    entry that stays keeps its comment (why it fails)."""
    path, covered_by = path or KNOWN_FAILURES, covered_by or _covered_by
    known = read_known_failures(path)
    kept = {entry for entry in known if covered_by(entry) not in ran}
    lines = [
        f"{entry}  # {known[entry]}" if known.get(entry) else entry for entry in sorted(kept | set(lost))
    ]
    path.write_text("\n".join([*(header or KNOWN_FAILURES_HEADER), *lines]) + "\n")


def _covered_by(entry: str) -> str:
    """The script name or unit file an entry of the known-failures list belongs to."""
    return entry.split(" ", 1)[1] if entry.startswith("script ") else entry.split("::", 1)[0]


def write_table(entries: list[dict]) -> None:
    reference, ours = load_json(REFERENCE_COUNTS), load_json(RESULTS / "drivetrain.json")
    relabel(reference.get("files", {}), entries)
    relabel(ours.get("files", {}), entries)
    table.write(reference, ours, entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="peer/run.py", description=__doc__.split("\n\n")[0])
    what = parser.add_argument_group("what to run")
    what.add_argument(
        "--scripts", nargs="*", metavar="NAME", help="the multi-process scripts (default: all 7)"
    )
    what.add_argument(
        "--unit", nargs="+", metavar="FILE", default=[], help="unit files, e.g. tests/test_utils.py"
    )
    what.add_argument("--fast", action="store_true", help="the scripts and the fast unit files (CI's subset)")
    what.add_argument("--all", action="store_true", help="every script and every unit file")
    what.add_argument("--table", action="store_true", help="only regenerate docs/peer-suite.md")
    what.add_argument("--gaps", action="store_true", help="only regenerate peer/GAPS.md")
    how = parser.add_argument_group("how")
    how.add_argument("--reference", action="store_true", help="run against the reference (no rename)")
    how.add_argument("--diagnose", action="store_true", help="defer missing names to first use (not counted)")
    how.add_argument(
        "--cache", type=Path, default=default_cache(), help="cache folder (default: %(default)s)"
    )
    how.add_argument("--python", type=Path, default=Path(sys.executable), help="drivetrain's interpreter")
    how.add_argument("--script-timeout", type=float, default=300, help="seconds per script (default 300)")
    how.add_argument("--test-timeout", type=float, default=180, help="seconds per unit test (default 180)")
    how.add_argument("--file-timeout", type=float, default=1800, help="seconds per unit file (default 1800)")
    how.add_argument("--report-only", action="store_true", help="exit 0 even when something regresses")
    how.add_argument(
        "--update-known-failures",
        action="store_true",
        help="rewrite peer/known_failures.txt with what this run saw fail (for what it ran)",
    )
    args = parser.parse_args(argv)

    if args.reference and args.diagnose:
        parser.error("--diagnose applies to drivetrain only")
    if args.table:
        write_table(load_not_applicable())
        return 0
    if args.gaps:
        from peer import gaps

        gaps.write(args.cache, args.python)
        return 0
    if args.scripts is None and not (args.unit or args.fast or args.all):
        parser.error("say what to run: --scripts, --unit FILE..., --fast or --all")

    started = time.monotonic()
    side_name = "reference" if args.reference else "drivetrain"
    python = reference_venv(args.cache) if args.reference else args.python.absolute()
    work = source.prepare_work(args.cache, side_name)
    side = Side(side_name, python, work, args.cache, diagnose=args.diagnose)
    entries = load_not_applicable()

    for name in args.scripts or []:
        if name not in SCRIPTS:
            parser.error(f"--scripts: no script {name} (choose from {', '.join(SCRIPTS)})")
    scripts_to_run = args.scripts or (list(SCRIPTS) if args.scripts == [] or args.fast or args.all else [])
    files = unit_files(work) if args.all else [*(FAST_UNIT_FILES if args.fast else []), *args.unit]
    for file in files:
        if not (work / file).is_file():
            parser.error(
                f"--unit: no {file} in the reference's tests (choose from {', '.join(unit_files(work))})"
            )

    scripts: dict[str, dict] = {}
    for name in scripts_to_run:
        result = run_script(side, name, args.script_timeout)
        scripts[name] = result
        print(f"peer [{side_name}] script {name}: {result['outcome']} ({result['seconds']} s) {result['message']}",
              flush=True)  # fmt: skip
    units: dict[str, dict] = {}
    for file in files:
        run = run_unit(side, file, entries, args.test_timeout, args.file_timeout)
        units[file] = run
        counts = side_counts(side, file, run["tests"])
        summary = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped", "not applicable"))
        note = run["error"] or import_error(run["tests"])
        print(f"peer [{side_name}] {file}: {summary} ({run['seconds']} s) {note[:200]}", flush=True)

    if args.reference:
        kept = {name: {**r, "tail": tail(r["tail"], 12)} if r["outcome"] != "passed" else
                {"outcome": r["outcome"], "seconds": r["seconds"]} for name, r in scripts.items()}  # fmt: skip
        store(REFERENCE_COUNTS, side, kept, slim(units))
    else:
        path = RESULTS / ("diagnose.json" if args.diagnose else "drivetrain.json")
        store(path, side, scripts, units)
        if not args.diagnose:
            write_table(entries)

    totals: Counter = Counter()
    for file, run in units.items():
        totals.update(side_counts(side, file, run["tests"]))
    passed_scripts = sum(r["outcome"] == "passed" for r in scripts.values())
    elapsed = time.monotonic() - started
    print(f"peer [{side_name}]: scripts {passed_scripts} of {len(scripts)} passed; unit tests "
          f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped, "
          f"{totals['not applicable']} not applicable; {elapsed:.0f} s")  # fmt: skip
    if args.reference or args.diagnose:
        return 0
    lost = regressions(load_json(REFERENCE_COUNTS), scripts, units)
    if args.update_known_failures:
        write_known_failures(lost, {*scripts, *units})
    known = load_known_failures()
    ran = {*scripts, *units}
    fixed = sorted(entry for entry in known if _covered_by(entry) in ran and entry not in lost)
    new = [entry for entry in lost if entry not in known]
    if lost:
        print(f"peer: {len(lost)} that pass on the reference do not pass here ({len(lost) - len(new)} known)")
    if fixed:
        print(
            f"peer: {len(fixed)} listed in {KNOWN_FAILURES.name} pass now, remove them: {', '.join(fixed[:10])}"
        )
    if new:
        print(f"peer: {len(new)} regressions (not in {KNOWN_FAILURES.name}): {', '.join(new[:10])}")
    return 1 if new and not args.report_only else 0


if __name__ == "__main__":
    sys.exit(main())
