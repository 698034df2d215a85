"""Running the suite: check the spec here, launch the worker, turn its records into verdicts.

One launch checks many backends (``run_suite([...])``): each launch costs seconds of process start-up, so
the suite's own tests batch the backends they check. The oracle (the reference backend on combined batches,
for 1..8 processes) is computed once per Python process and reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import attrs

from drivetrain_conformance import worker
from drivetrain_conformance.properties import PROPERTIES, not_applicable, tolerance_for
from drivetrain_conformance.static import check_spec
from drivetrain_conformance.targets import target_name

PASS, FAIL, NOT_APPLICABLE = "pass", "FAIL", "n/a"
_oracle_cache: dict[str, Any] = {}


@attrs.define(frozen=True)
class Verdict:
    property: str
    status: str
    reason: str = ""


@attrs.define
class Report:
    """Every property's verdict for one backend at one process count."""

    backend: str
    processes: int
    verdicts: list[Verdict]
    #: plugins the checked Accelerators named besides the backend (a device or feature plugin under test)
    plugins: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(v.status != FAIL for v in self.verdicts)

    def status(self, name: str) -> str:
        return next(v.status for v in self.verdicts if v.property == name)

    @property
    def failed(self) -> list[str]:
        return [v.property for v in self.verdicts if v.status == FAIL]

    def format(self) -> str:
        width = max(len(prop.name) for prop in PROPERTIES)
        named = f" with plugins {', '.join(self.plugins)}" if self.plugins else ""
        lines = [f"drivetrain conformance: backend {self.backend!r}{named}, {self.processes} process(es)"]
        for v in self.verdicts:
            lines.append(f"  {v.status:<4}  {v.property:<{width}}  {v.reason}".rstrip())
        failed = self.failed
        lines.append(
            f"{len(failed)} failed: {', '.join(failed)}" if failed else "all applicable properties pass"
        )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "plugins": list(self.plugins),
            "processes": self.processes,
            "ok": self.ok,
            "verdicts": [attrs.asdict(v) for v in self.verdicts],
        }


@attrs.define
class Launch:
    returncode: int | None
    output: str
    records: dict[int, list[dict]]
    tensors_dir: str


def _launch(args: list[str], processes: int, workdir: str, timeout: float) -> Launch:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": workdir}
    if processes == 1:
        command = [sys.executable, worker.__file__, *args]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={processes}",
            "--monitor_interval=0.1",
            worker.__file__,
            *args,
        ]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = None
        output = f"timed out after {timeout:.0f} s\n" + "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else (part or "")
            for part in (exc.stdout, exc.stderr)
        )
    records = {}
    for rank in range(processes):
        path = os.path.join(workdir, f"rank{rank}.jsonl")
        records[rank] = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    return Launch(returncode, output, records, workdir)


def oracle_tensors(timeout: float = 300) -> dict[str, Any]:
    """The reference backend's weights after training on combined batches (computed once per process)."""
    if not _oracle_cache:
        with tempfile.TemporaryDirectory(prefix="drivetrain-oracle-") as workdir:
            launch = _launch(["--oracle", "--out", workdir], 1, workdir, timeout)
            _store_oracle(launch)
    return _oracle_cache


def _store_oracle(launch: Launch) -> None:
    import torch

    path = os.path.join(launch.tensors_dir, "oracle.rank0.pt")
    if not os.path.exists(path):
        raise RuntimeError(f"the reference backend's oracle run failed:\n{launch.output[-4000:]}")
    _oracle_cache.update(torch.load(path))


def _tail(output: str, lines: int = 6) -> str:
    return " | ".join(line for line in output.strip().splitlines()[-lines:])


def _training_verdict(target_id: str, launch: Launch, processes: int, info: Any) -> tuple[bool, str]:
    """Compare every rank's weights with one process on the combined batch, per precision."""
    import torch

    found = []
    for rank in range(processes):
        path = os.path.join(launch.tensors_dir, f"{target_id}.rank{rank}.pt")
        tensors = torch.load(path, weights_only=False) if os.path.exists(path) else {}
        for key, weights in sorted(tensors.items()):
            if not key.startswith("training/"):
                continue
            precision = key.split("/")[1]
            tolerance = tolerance_for(precision, info)
            expected = _oracle_cache[f"oracle/{precision}/{processes}"]
            worst = max(
                float(((a - e).abs() - tolerance.rtol * e.abs()).max()) for a, e in zip(weights, expected)
            )
            difference = max(float((a - e).abs().max()) for a, e in zip(weights, expected))
            if worst > tolerance.atol:
                return False, (
                    f"rank {rank}, mixed_precision={precision!r}: weights differ from the reference "
                    f"by up to {difference:.3g} (allowed {tolerance.atol:g} + {tolerance.rtol:g}*|ref|)"
                )
            if rank == 0:
                found.append(f"{precision}: {difference:.1e}")
    return True, "max difference " + ", ".join(found)


def _worker_verdict(prop: str, target_id: str, launch: Launch, processes: int, info: Any) -> Verdict:
    details = {}
    for rank in range(processes):
        mine = [r for r in launch.records[rank] if r.get("target") == target_id and r.get("property") == prop]
        if not mine:
            why = "timed out" if launch.returncode is None else f"exit code {launch.returncode}"
            return Verdict(prop, FAIL, f"no result from rank {rank} ({why}): {_tail(launch.output)}")
        if not mine[0]["ok"]:
            prefix = f"rank {rank}: " if processes > 1 else ""
            return Verdict(prop, FAIL, prefix + mine[0]["detail"])
        details[rank] = mine[0]["detail"]
    if prop in ("one_process_matches_local", "multi_process_matches_combined_batch"):
        try:
            ok, detail = _training_verdict(target_id, launch, processes, info)
        except Exception as exc:
            return Verdict(prop, FAIL, f"could not compare the recorded weights: {type(exc).__name__}: {exc}")
        return Verdict(prop, PASS if ok else FAIL, detail)
    return Verdict(prop, PASS, details[0])


def _exit_verdict(launch: Launch, processes: int) -> Verdict:
    unfinished = [
        rank for rank in range(processes) if not any(r.get("finished") for r in launch.records[rank])
    ]
    if launch.returncode is None:
        return Verdict("clean_exit", FAIL, f"the run timed out: {_tail(launch.output)}")
    if launch.returncode != 0 or unfinished or "terminate called" in launch.output:
        what = f"exit code {launch.returncode}" + (
            f", ranks {unfinished} did not finish" if unfinished else ""
        )
        return Verdict("clean_exit", FAIL, f"{what}: {_tail(launch.output)}")
    return Verdict("clean_exit", PASS, f"exit code 0 on {processes} rank(s)")


def run_suite(
    targets: list[str],
    processes: int = 1,
    timeout: float = 600,
    workdir: str | None = None,
    plugins: tuple[str, ...] = (),
) -> dict[str, Report]:
    """Check every backend in ``targets`` (installed plugin names or ``.py`` files) with ``processes``
    processes in one launch. Returns a :class:`Report` per target, keyed by the target as given.

    ``plugins`` are named by every Accelerator the checks build (``Accelerator(plugins=[...])``), so a device
    or feature plugin is checked over each backend, against the oracle of the reference backend alone."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    with tempfile.TemporaryDirectory(prefix="drivetrain-conformance-") as scratch:
        workdir = workdir or scratch
        static = {spec: check_spec(spec) for spec in targets}
        ids = {spec: f"t{index}" for index, spec in enumerate(targets)}
        launched = [
            spec
            for spec in targets
            if static[spec][1] is not None
            and any(
                not_applicable(p.name, static[spec][1], processes) is None
                for p in PROPERTIES
                if p.where == "worker"
            )
        ]
        args = ["--out", workdir, "--targets", ",".join(f"{ids[spec]}={spec}" for spec in launched)]
        if plugins:
            args += ["--plugins", ",".join(plugins)]
        launch = Launch(0, "", {rank: [{"finished": True}] for rank in range(processes)}, workdir)
        if launched:
            with_oracle = processes == 1 and not _oracle_cache
            if not with_oracle:
                oracle_tensors(timeout)
            launch = _launch(args + (["--oracle"] if with_oracle else []), processes, workdir, timeout)
            if with_oracle:
                _store_oracle(launch)
        reports = {}
        for spec in targets:
            problem, info = static[spec]
            verdicts = [Verdict("hooks_match_spec", FAIL if problem else PASS, problem or "")]
            for prop in PROPERTIES[1:]:
                reason = not_applicable(prop.name, info, processes) if info is not None else None
                if info is None:
                    verdicts.append(Verdict(prop.name, FAIL, "not run: the backend did not load"))
                elif reason is not None:
                    verdicts.append(Verdict(prop.name, NOT_APPLICABLE, reason))
                elif prop.where == "launch":
                    verdicts.append(_exit_verdict(launch, processes))
                else:
                    verdicts.append(_worker_verdict(prop.name, ids[spec], launch, processes, info))
            reports[spec] = Report(target_name(spec), processes, verdicts, tuple(plugins))
        return reports
