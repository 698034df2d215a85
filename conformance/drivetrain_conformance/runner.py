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
#: The oracle's tensors, keyed "<what>/<precision>/<processes>", for the process counts in _oracle_counts.
_oracle_cache: dict[str, Any] = {}
_oracle_counts: set[int] = set()
#: Where the oracle saved the reference backend's recipe checkpoints (lives as long as this process).
_oracle_checkpoints: list[str] = []


def _checkpoints_dir() -> str:
    if not _oracle_checkpoints:
        import atexit
        import shutil

        folder = tempfile.mkdtemp(prefix="drivetrain-oracle-checkpoints-")
        atexit.register(shutil.rmtree, folder, True)
        _oracle_checkpoints.append(folder)
    return _oracle_checkpoints[0]


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


def _oracle_args(processes: int) -> list[str]:
    return ["--oracle", str(processes), "--checkpoints", _checkpoints_dir()]


def oracle_tensors(processes: int = 1, timeout: float = 300) -> dict[str, Any]:
    """The reference backend on the combined batches of ``processes`` processes (computed once per process
    count in this Python process)."""
    if processes not in _oracle_counts:
        with tempfile.TemporaryDirectory(prefix="drivetrain-oracle-") as workdir:
            launch = _launch([*_oracle_args(processes), "--out", workdir], 1, workdir, timeout)
            _store_oracle(launch, processes)
    return _oracle_cache


def _store_oracle(launch: Launch, processes: int) -> None:
    import torch

    path = os.path.join(launch.tensors_dir, "oracle.rank0.pt")
    if not os.path.exists(path):
        raise RuntimeError(f"the reference backend's oracle run failed:\n{launch.output[-4000:]}")
    _oracle_cache.update(torch.load(path))
    _oracle_counts.add(processes)


def _tail(output: str, lines: int = 6) -> str:
    return " | ".join(line for line in output.strip().splitlines()[-lines:])


def _excess(actual: list, expected: list, tolerance: Any) -> tuple[float, float]:
    """(how far ``actual`` exceeds the tolerance, worst absolute difference); the first <= atol passes."""
    if len(actual) != len(expected) or any(a.shape != e.shape for a, e in zip(actual, expected)):
        return float("inf"), float("inf")
    worst = max(float(((a - e).abs() - tolerance.rtol * e.abs()).max()) for a, e in zip(actual, expected))
    difference = max(float((a - e).abs().max()) for a, e in zip(actual, expected))
    return worst, difference


def _close(actual: list, expected: list, tolerance: Any) -> bool:
    return _excess(actual, expected, tolerance)[0] <= tolerance.atol


def _rank_tensors(launch: Launch, target_id: str, processes: int) -> list[dict[str, Any]]:
    import torch

    found = []
    for rank in range(processes):
        path = os.path.join(launch.tensors_dir, f"{target_id}.rank{rank}.pt")
        found.append(torch.load(path, weights_only=False) if os.path.exists(path) else {})
    return found


def _ranks_disagree(per_rank: list[dict[str, Any]], key: str) -> bool:
    first = per_rank[0].get(key)
    return first is not None and any(
        other.get(key) is not None and any(not (a == b).all() for a, b in zip(first, other[key]))
        for other in per_rank[1:]
    )


NOT_SYNCHRONISED = (
    "the processes hold different weights: gradients are not averaged across processes (wrap_model must "
    "all-reduce them, and no_sync() must end at each accumulation boundary)"
)


def _training_verdict(target_id: str, launch: Launch, processes: int, info: Any) -> tuple[bool, str]:
    """Compare every rank's weights with one process on the combined batch, per precision; on a
    mismatch, name the likely mistake by comparing with the oracle's runs of known mistakes."""
    per_rank = _rank_tensors(launch, target_id, processes)
    found = []
    for rank, tensors in enumerate(per_rank):
        for key, weights in sorted(tensors.items()):
            if not key.startswith("training/"):
                continue
            precision = key.split("/")[1]
            tolerance = tolerance_for(precision, info)
            expected = _oracle_cache[f"oracle/{precision}/{processes}"]
            worst, difference = _excess(weights, expected, tolerance)
            if worst > tolerance.atol:
                where = f"rank {rank}, mixed_precision={precision!r}: "
                if processes > 1 and _ranks_disagree(per_rank, key):
                    return False, where + NOT_SYNCHRONISED
                summed = _oracle_cache.get(f"oracle-summed/{precision}/{processes}")
                if summed is not None and _close(weights, summed, tolerance):
                    return False, where + (
                        "the weights equal training with gradients summed over the processes: average them "
                        "(divide the all-reduced gradients by the number of processes)"
                    )
                return False, where + (
                    f"weights differ from the reference by up to {difference:.3g} (allowed "
                    f"{tolerance.atol:g} + {tolerance.rtol:g}*|ref|): check how the backward pass, the "
                    "gradient reduction and the optimizer step differ from loss.backward() + optimizer.step()"
                )
            if rank == 0:
                found.append(f"{precision}: {difference:.1e}")
    return True, "max difference " + ", ".join(found)


def _format_lrs(lrs: Any) -> str:
    return "[" + ", ".join(f"{float(v):.4g}" for v in lrs) + "]"


def _recipe_verdict(target_id: str, launch: Launch, processes: int, info: Any) -> tuple[bool, str]:
    """The recipe's learning rates, weights and AdamW state against the reference backend's."""
    import torch

    per_rank = _rank_tensors(launch, target_id, processes)
    found, moments_compared = [], False
    for rank, tensors in enumerate(per_rank):
        precisions = sorted({key.split("/")[1] for key in tensors if key.startswith("recipe/")})
        if not precisions:
            return False, f"rank {rank} recorded no recipe results"
        for precision in precisions:
            where = f"rank {rank}, mixed_precision={precision!r}: " if processes > 1 else f"{precision}: "
            key, reference = f"recipe/{precision}", f"recipe/{precision}/{processes}"
            tolerance = tolerance_for(precision, info)
            lrs, expected_lrs = tensors[f"{key}/lrs"][0], _oracle_cache[f"{reference}/lrs"][0]
            if lrs.shape != expected_lrs.shape or not torch.allclose(lrs, expected_lrs, rtol=1e-6, atol=0):
                return False, where + (
                    f"the optimizer's learning rate after each step was {_format_lrs(lrs)}, the reference "
                    f"backend's {_format_lrs(expected_lrs)}: the backend must not step or replace the user's "
                    "scheduler (the kernel's AcceleratedScheduler steps it with the optimizer steps that happen)"
                )
            weights = tensors[f"{key}/weights"]
            worst, difference = _excess(weights, _oracle_cache[f"{reference}/weights"], tolerance)
            if worst > tolerance.atol:
                unbound = _oracle_cache[f"recipe-unbound/{precision}/{processes}/weights"]
                if _close(weights, unbound, tolerance):
                    return False, where + (
                        "the scheduler did not change the learning rate of the optimizer the backend "
                        "returned (the weights equal training at a constant learning rate): bind schedulers "
                        "to the wrapped optimizer; the kernel rebinds them to what wrap_optimizer returns "
                        "(plugin_api.rebind_scheduler), so that object's param_groups must be the ones its "
                        "step() uses"
                    )
                if processes > 1 and _ranks_disagree(per_rank, f"{key}/weights"):
                    return False, where + NOT_SYNCHRONISED
                unclipped = _oracle_cache[f"recipe-unclipped/{precision}/{processes}/weights"]
                if _close(weights, unclipped, tolerance):
                    return False, where + (
                        "the weights equal training without gradient clipping: accelerator.clip_grad_norm_ "
                        "did not clip (the clip_grad_norm hook must clip the gradients that the optimizer "
                        "steps with, by the norm over all processes, and return that norm)"
                    )
                full_precision = _oracle_cache[f"recipe/no/{processes}/weights"]
                if precision != "no" and _close(weights, full_precision, tolerance_for("no", info)):
                    return False, where + (
                        "the weights equal training in float32: mixed precision is not applied (the autocast "
                        "hook must return a context computing in the requested dtype, or None for torch.autocast)"
                    )
                return False, where + (
                    f"AdamW weights differ from the reference by up to {difference:.3g} (allowed "
                    f"{tolerance.atol:g} + {tolerance.rtol:g}*|ref|) with a matching learning rate schedule: "
                    "check mixed precision (autocast's dtype, loss scaling), gradient accumulation (the loss is "
                    "divided by the accumulation steps once), clip_grad_norm_ (the norm of the whole model, "
                    "after unscaling) and the optimizer step"
                )
            moments = tensors.get(f"{key}/moments")
            expected_moments = _oracle_cache.get(f"{reference}/moments")
            if moments is not None and expected_moments is not None:
                moments_compared = True
                worst, moment_difference = _excess(moments, expected_moments, tolerance)
                if worst > tolerance.atol:
                    return False, where + (
                        f"the weights match but AdamW's exp_avg/exp_avg_sq differ from the reference by up to "
                        f"{moment_difference:.3g}: the optimizer state the user reads is not the one that steps"
                    )
            if rank == 0:
                found.append(f"{precision}: {difference:.1e}")
    state = "AdamW state compared" if moments_compared else "AdamW state not readable whole here (sharded)"
    return True, f"max weight difference {', '.join(found)}; learning rates equal; {state}"


def _portable_verdict(
    target_id: str, launch: Launch, processes: int, on_local: Launch | None
) -> tuple[bool, str]:
    """Both directions of a portable checkpoint against the uninterrupted reference run."""
    import torch

    tolerance = tolerance_for("no", None)
    expected = _oracle_cache[f"recipe/no/{processes}/weights"]
    for rank, tensors in enumerate(_rank_tensors(launch, target_id, processes)):
        resumed = tensors.get("portable/resumed-from-local")
        if resumed is None:
            return False, f"rank {rank} recorded no weights after resuming the reference checkpoint"
        worst, difference = _excess(resumed, expected, tolerance)
        if worst > tolerance.atol:
            return False, (
                (f"rank {rank}: " if processes > 1 else "")
                + f"resuming a checkpoint of the reference backend here and training on differs "
                f"from the uninterrupted reference run by up to {difference:.3g}: load_state does not restore "
                "everything the reference files hold (model, AdamW state, scheduler)"
            )
    if on_local is None:
        return False, "the reference backend's resume launch did not run"
    failure = next(
        (
            r["on_local"]
            for r in on_local.records.get(0, [])
            if r.get("target") == target_id and "on_local" in r
        ),
        None,
    )
    if failure is not None:
        return False, (
            f"the reference backend could not load this backend's checkpoint ({failure}): with "
            "portable_checkpoints=True, save_state must write the whole state in the reference format "
            "(consolidate a sharded optimizer's state before saving), or declare portable_checkpoints=False"
        )
    path = os.path.join(on_local.tensors_dir, f"{target_id}.on-local.pt")
    if not os.path.exists(path):
        return False, f"the reference backend's resume launch failed: {_tail(on_local.output)}"
    tensors = torch.load(path, weights_only=False)
    saved_moments = _oracle_cache.get(f"recipe-at-resume/no/{processes}/moments")
    if saved_moments is not None:
        worst, difference = _excess(tensors["loaded-moments"], saved_moments, tolerance)
        if worst > tolerance.atol:
            return False, (
                f"the AdamW state in this backend's checkpoint differs from the reference's at the same step "
                f"by up to {difference:.3g}: save_state wrote part of the state, or one process's shard as "
                "if it were the whole"
            )
    worst, difference = _excess(tensors["resumed-weights"], expected, tolerance)
    if worst > tolerance.atol:
        return False, (
            f"resuming this backend's checkpoint on the reference backend and training on differs from the "
            f"uninterrupted reference run by up to {difference:.3g}: the checkpoint's model, optimizer or "
            "scheduler state is not what the reference format holds"
        )
    return True, "backend -> local and local -> backend resume equal the uninterrupted reference run"


def _worker_verdict(
    prop: str, target_id: str, launch: Launch, processes: int, info: Any, on_local: Launch | None = None
) -> Verdict:
    details = {}
    for rank in range(processes):
        mine = [r for r in launch.records[rank] if r.get("target") == target_id and r.get("property") == prop]
        if not mine:
            why = "timed out" if launch.returncode is None else f"exit code {launch.returncode}"
            return Verdict(prop, FAIL, f"no result from rank {rank} ({why}): {_tail(launch.output)}")
        if not mine[0]["ok"]:
            prefix = f"rank {rank}: " if processes > 1 and not mine[0]["detail"].startswith("rank ") else ""
            return Verdict(prop, FAIL, prefix + mine[0]["detail"])
        details[rank] = mine[0]["detail"]
    if prop in ("one_process_matches_local", "multi_process_matches_combined_batch"):
        try:
            ok, detail = _training_verdict(target_id, launch, processes, info)
        except Exception as exc:
            return Verdict(prop, FAIL, f"could not compare the recorded weights: {type(exc).__name__}: {exc}")
        return Verdict(prop, PASS if ok else FAIL, detail)
    comparisons = {
        "adamw_schedule_matches_local": lambda: _recipe_verdict(target_id, launch, processes, info),
        "checkpoint_portable": lambda: _portable_verdict(target_id, launch, processes, on_local),
    }
    if prop in comparisons:
        try:
            ok, detail = comparisons[prop]()
        except Exception as exc:
            return Verdict(prop, FAIL, f"could not compare the recorded results: {type(exc).__name__}: {exc}")
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
        args += ["--checkpoints", _checkpoints_dir()]
        if plugins:
            args += ["--plugins", ",".join(plugins)]
        launch = Launch(0, "", {rank: [{"finished": True}] for rank in range(processes)}, workdir)
        on_local = None
        if launched:
            # One process: the oracle runs first in the same launch (a launch costs seconds of start-up).
            with_oracle = processes == 1 and processes not in _oracle_counts
            if not with_oracle:
                oracle_tensors(processes, timeout)
            launch = _launch(args + (["--oracle", "1"] if with_oracle else []), processes, workdir, timeout)
            if with_oracle:
                _store_oracle(launch, processes)
            portable = [
                spec
                for spec in launched
                if not_applicable("checkpoint_portable", static[spec][1], processes) is None
                and os.path.isdir(os.path.join(workdir, f"portable-{ids[spec]}"))
            ]
            if portable:
                # Every portable backend's checkpoint resumed by the reference backend, in one more launch.
                resume_dir = os.path.join(workdir, "on-local")
                os.makedirs(resume_dir)
                pairs = ",".join(
                    f"{ids[spec]}={os.path.join(workdir, 'portable-' + ids[spec])}" for spec in portable
                )
                on_local = _launch(
                    ["--out", resume_dir, "--resume-on-local", pairs, "--as-processes", str(processes)],
                    1,
                    resume_dir,
                    timeout,
                )
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
                    verdicts.append(_worker_verdict(prop.name, ids[spec], launch, processes, info, on_local))
            reports[spec] = Report(target_name(spec), processes, verdicts, tuple(plugins))
        return reports
