#!/usr/bin/env python
"""The Hugging Face stack's own tests as the judge: transformers' Trainer tests, peft's and trl's, run once with
the real Accelerate serving ``import accelerate`` and once with drivetrain serving it, in the same interpreter.
See hfstack/README.md.

    python hfstack/run.py --fast                 # drivetrain's side of CI's subset, against the stored reference
    python hfstack/run.py --all                  # drivetrain's side of every file; regenerates the table
    python hfstack/run.py --all --reference      # the reference's side: rewrites hfstack/reference_results.json
    python hfstack/run.py --all --both           # both sides, one after the other (the whole judge)
    python hfstack/run.py --source peft --file tests/test_vera.py
    python hfstack/run.py --table                # docs/hf-stack-harness.md from the stored results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from hfstack import sides, sources, table  # noqa: E402
from peer import junit  # noqa: E402
from peer.run import default_cache, read_known_failures, run_logged, tail, write_known_failures  # noqa: E402

HFSTACK = REPOSITORY / "hfstack"
RESULTS = HFSTACK / "results"
REFERENCE_RESULTS = HFSTACK / "reference_results.json"
KNOWN_FAILURES = HFSTACK / "known_failures.txt"
KNOWN_FAILURES_HEADER = [
    "# Tests that pass with the real Accelerate (hfstack/reference_results.json) and do not pass with drivetrain",
    "# serving `accelerate`: one `<source>:<test id>` a line, with why after `#` (docs/hf-stack-harness.md",
    "# prints it). `scripts/hfstack` exits 1 only on a failure not listed here. `--update-known-failures`",
    "# rewrites the entries of what a run covered with what failed in it; write the why for a new entry.",
]

# A test that did not pass counts as needing the hub when it tried the network (hfstack/startup/
# hfstack_network.py logs it) or when its error says so: offline mode, nothing in the local cache, no route.
HUB_PATTERNS = re.compile(
    r"hfstack: no network|OfflineModeIsEnabled|LocalEntryNotFoundError|offline mode|HF_HUB_OFFLINE|"
    r"couldn't connect to|We couldn't connect|Cannot find the requested files in the disk cache|"
    r"is not a local folder and is not a valid model identifier|Failed to resolve|Max retries exceeded|"
    r"Couldn't reach|ConnectError|ConnectionError|Name or service not known|Temporary failure in name|"
    r"not fully cached locally|cached snapshot folder",
    re.IGNORECASE,
)
OUTCOMES = ("passed", "failed", "skipped", "hub")


def _node_to_id(nodeid: str) -> str:
    """pytest's node id (``file::Outer::Inner::test``) as peer/junit.py writes test ids (``file::Outer.Inner::test``)."""
    parts = nodeid.split("::")
    if len(parts) <= 2:
        return nodeid
    return f"{parts[0]}::{'.'.join(parts[1:-1])}::{parts[-1]}"


def classify(tests: dict[str, dict], network_log: Path | None = None) -> dict[str, dict]:
    """Mark the tests that did not pass and needed the hub (outcome ``hub``, the first outcome kept in
    ``ran_as``)."""
    tried = set()
    if network_log is not None and network_log.is_file():
        tried = {_node_to_id(line.strip()) for line in network_log.read_text().splitlines() if line.strip()}
    for test_id, result in tests.items():
        if result["outcome"] != "failed":
            continue
        evidence = test_id in tried or HUB_PATTERNS.search(
            result.get("message", "") + result.get("detail", "")
        )
        if evidence:
            result["ran_as"], result["outcome"] = result["outcome"], "hub"
    return tests


def run_file(side: sides.Side, source: sources.Source, work: Path, file: str, args) -> dict:
    """One test file in its own pytest process; {"seconds", "error", "tests": {id: result}}."""
    tmp = args.cache / "tmp" / side.name / source.name / Path(file).stem
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    report, log, network_log = tmp / "junit.xml", tmp / "pytest.log", tmp / "network.log"
    command = [
        str(side.python), "-m", "pytest", file, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
        f"--timeout={args.test_timeout:.0f}", f"--junitxml={report}", "-o", "junit_family=xunit1",
    ]  # fmt: skip
    start = time.monotonic()
    code, note = run_logged(command, work, side.env(source, tmp, network_log), args.file_timeout, log, report)
    seconds = time.monotonic() - start
    error = note
    if code not in (0, 1, None) and not report.is_file():
        error = f"pytest exit code {code}: {tail(log.read_text(errors='replace'), 15)}"
    tests = junit.read(report, file) if report.is_file() else {}
    tests = classify(tests, network_log)
    return {"seconds": round(seconds, 1), "error": error, "tests": tests}


def count(tests: dict[str, dict]) -> Counter:
    return Counter({outcome: 0 for outcome in OUTCOMES}) + Counter(r["outcome"] for r in tests.values())


def load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def load_results(path: Path) -> dict:
    """Stored results, with the hub rule applied again to their messages (it may have learnt a pattern since)."""
    data = load_json(path)
    for stored in data.get("sources", {}).values():
        for run in stored.get("files", {}).values():
            classify(run["tests"])
    return data


def store(path: Path, side: sides.Side, runs: dict, notes: dict, slim: bool) -> dict:
    """Merge this run's files into the stored results (a partial run updates only what it ran)."""
    data = load_json(path)
    for source_name, files in runs.items():
        stored = data.setdefault("sources", {}).setdefault(source_name, {})
        stored.setdefault("files", {}).update(files)
        stored.update(notes.get(source_name, {}))
    if slim:  # the committed reference keeps each test's outcome and, when it did not pass, its message
        for stored in data["sources"].values():
            for run in stored["files"].values():
                for result in run["tests"].values():
                    result.pop("detail", None)
                    result.pop("seconds", None)
                    if result["outcome"] == "passed":
                        result.pop("message", None)
                    elif "message" in result:
                        result["message"] = result["message"][:200]
    data["side"] = side.name
    data["served_by"] = side.served_by
    data["machine"] = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    data["updated"] = time.strftime("%Y-%m-%d %H:%M:%S")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def _covered_by(entry: str) -> str:
    """The ``source:file`` an entry of hfstack/known_failures.txt belongs to."""
    return entry.split("::", 1)[0]


def selected(args, parser) -> dict[str, list[str]]:
    """{source name: the files to run}."""
    names = args.source or list(sources.SOURCES)
    for name in names:
        if name not in sources.SOURCES:
            parser.error(f"--source: no source {name} (choose from {', '.join(sources.SOURCES)})")
    chosen = {}
    for name in names:
        source = sources.SOURCES[name]
        if args.file:
            files = list(args.file)
        elif args.fast:
            files = list(source.fast)
        else:
            files = list(source.files) + [f for f in source.on_request if f in (args.with_ or [])]
        known = set(source.files) | set(source.on_request)
        for file in files:
            if file not in known:
                parser.error(
                    f"--file: {name} has no {file} in the harness (choose from {', '.join(sorted(known))})"
                )
        chosen[name] = files
    return chosen


def run_side(side_name: str, args, chosen: dict[str, list[str]]) -> tuple[dict, dict]:
    python = args.python.absolute()
    side = sides.Side(side_name, python, args.cache, serve=args.serve, patch_blockers=not args.no_patch)
    runs: dict[str, dict] = {}
    notes: dict[str, dict] = {}
    path = REFERENCE_RESULTS if side_name == "reference" else RESULTS / "drivetrain.json"
    side.prepare([sources.SOURCES[name] for name in chosen])
    for name, files in chosen.items():
        source = sources.SOURCES[name]
        try:
            work = sources.prepare_work(args.cache, source, side_name, args.sources)
        except sources.MissingSource as missing:
            print(f"hfstack [{side_name}] {name}: SKIPPED, {missing}", flush=True)
            continue
        probe = side.probe(source, args.cache / "tmp" / side_name / name / "probe")
        notes[name] = {
            "provenance": source.provenance,
            "requirements": list(source.requirements),
            "accelerate": {k: probe[k] for k in ("version", "accelerator_module", "patched")},
            "file_sha256": sources.file_digests(work, source),
        }
        patched = f", patched: {', '.join(probe['patched'])}" if probe["patched"] else ""
        print(f"hfstack [{side_name}] {name}: accelerate {probe['version']} from {probe['accelerator_module']} "
              f"({side.served_by}{patched})", flush=True)  # fmt: skip
        runs[name] = {}
        for file in files:
            run = run_file(side, source, work, file, args)
            runs[name][file] = run
            store(path, side, {name: {file: run}}, notes, slim=side_name == "reference")  # kept as it goes
            counts = count(run["tests"])
            summary = ", ".join(f"{counts[k]} {k}" for k in OUTCOMES)
            print(f"hfstack [{side_name}] {name} {file}: {summary} ({run['seconds']} s) {run['error'][:200]}",
                  flush=True)  # fmt: skip
    return runs, load_json(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hfstack/run.py", description=__doc__.split("\n\n")[0])
    what = parser.add_argument_group("what to run")
    what.add_argument("--fast", action="store_true", help="CI's subset: a few fast files per source")
    what.add_argument("--all", action="store_true", help="every file of every source")
    what.add_argument(
        "--source", nargs="+", metavar="NAME", help=f"only these ({', '.join(sources.SOURCES)})"
    )
    what.add_argument("--file", nargs="+", metavar="FILE", help="only these files of the --source")
    what.add_argument("--with", dest="with_", nargs="+", metavar="FILE", default=[],
                      help="add files run only on request (peft's tests/test_decoder_models.py)")  # fmt: skip
    what.add_argument("--table", action="store_true", help="only regenerate docs/hf-stack-harness.md")
    what.add_argument("--import-transformers", type=Path, metavar="CHECKOUT",
                      help="copy transformers' pinned test files from a git checkout into the sources folder")  # fmt: skip
    how = parser.add_argument_group("how")
    how.add_argument("--reference", action="store_true", help="run the reference's side only")
    how.add_argument("--both", action="store_true", help="run the reference's side, then drivetrain's")
    how.add_argument("--serve", choices=("auto", "alias", "distribution"), default=sides.SERVED_BY,
                     help="how drivetrain serves `accelerate` (default: %(default)s)")  # fmt: skip
    how.add_argument(
        "--no-patch", action="store_true", help="alias mode: leave the two known blockers as they are"
    )
    how.add_argument(
        "--cache", type=Path, default=default_cache("hfstack"), help="cache folder (default: %(default)s)"
    )
    how.add_argument("--sources", type=Path, help="folder holding transformers' pinned test files")
    how.add_argument("--python", type=Path, default=Path(sys.executable), help="the interpreter (both sides)")
    how.add_argument("--test-timeout", type=float, default=300, help="seconds per test (default 300)")
    how.add_argument("--file-timeout", type=float, default=1800, help="seconds per file (default 1800)")
    how.add_argument("--report-only", action="store_true", help="exit 0 even when something regresses")
    how.add_argument("--update-known-failures", action="store_true",
                     help="rewrite hfstack/known_failures.txt with what this run saw fail (for what it ran)")  # fmt: skip
    args = parser.parse_args(argv)

    if args.import_transformers:
        sources.import_pinned(
            sources.SOURCES["transformers"], args.import_transformers, args.cache, args.sources
        )
        return 0
    if args.table:
        table.write(
            load_results(REFERENCE_RESULTS),
            load_results(RESULTS / "drivetrain.json"),
            read_known_failures(KNOWN_FAILURES),
        )
        return 0
    if not (args.fast or args.all or args.source):
        parser.error("say what to run: --fast, --all or --source NAME [--file FILE...]")
    if args.file and (not args.source or len(args.source) != 1):
        parser.error("--file needs exactly one --source")

    started = time.monotonic()
    chosen = selected(args, parser)
    if args.reference or args.both:
        run_side("reference", args, chosen)
    if args.reference:
        print(f"hfstack [reference]: done in {time.monotonic() - started:.0f} s")
        return 0
    runs, _ = run_side("drivetrain", args, chosen)
    reference = load_results(REFERENCE_RESULTS)
    if args.all:  # a partial run would print a partial page: --table writes it from what is stored
        table.write(reference, load_results(RESULTS / "drivetrain.json"), read_known_failures(KNOWN_FAILURES))

    lost = [
        entry
        for entry, _, _ in table.lost(reference, {"sources": {n: {"files": f} for n, f in runs.items()}})
    ]
    ran = {f"{name}:{file}" for name, files in runs.items() for file in files}
    if args.update_known_failures:
        write_known_failures(lost, ran, KNOWN_FAILURES, KNOWN_FAILURES_HEADER, _covered_by)
    known = read_known_failures(KNOWN_FAILURES)
    fixed = sorted(entry for entry in known if _covered_by(entry) in ran and entry not in lost)
    new = [entry for entry in lost if entry not in known]
    kept, passing = table.kept(reference, runs)
    share = f"{100 * kept / passing:.1f}%" if passing else "-"
    print(f"hfstack: {kept} of the {passing} tests that pass with Accelerate pass with drivetrain ({share}); "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    if fixed:
        print(
            f"hfstack: {len(fixed)} listed in {KNOWN_FAILURES.name} pass now, remove them: {', '.join(fixed[:10])}"
        )
    if new:
        print(f"hfstack: {len(new)} regressions (not in {KNOWN_FAILURES.name}): {', '.join(new[:10])}")
    return 1 if new and not args.report_only else 0


if __name__ == "__main__":
    sys.exit(main())
