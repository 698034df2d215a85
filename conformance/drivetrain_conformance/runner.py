"""Running the suite: check the spec here, launch the worker, turn its records into verdicts as they come.

One launch checks many backends (``run_suite([...])``): each launch costs seconds of process start-up, so
the suite's own tests batch the backends they check. The oracle (the reference backend on combined batches,
for 1..8 processes) is computed once per Python process and reused.

Every step of a launch has a time limit (``timeout``, per property). A property that runs over it is a
finding: its verdict names the hook and the collective each rank waits in (launching.py), the launch is
stopped, and the next launch goes on with the properties not yet judged.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import attrs

from drivetrain.plugin_api.tooling import get_plugin_registry
from drivetrain_conformance.launching import START_STEP, Hang, Launch, launch
from drivetrain_conformance.properties import (
    DEFAULT_TIMEOUT,
    PROPERTIES,
    WORKER_PROPERTIES,
    not_applicable,
    tolerance_for,
    unusable_plugin,
)
from drivetrain_conformance.static import check_spec
from drivetrain_conformance.targets import target_name
from drivetrain_conformance.worker import ORACLE_STEP, SETUP_STEP, SHUTDOWN_STEP

PASS, FAIL, NOT_APPLICABLE = "pass", "FAIL", "n/a"
#: After this many hangs of one backend, its properties not yet run are reported without running them.
HANGS_PER_BACKEND = 2
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
    #: for a property that hung: the main thread's stack of every rank when the launch was stopped
    stacks: str = ""


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
            lines += [f"        {line}" for line in v.stacks.splitlines()]
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


def _oracle_args(processes: int) -> list[str]:
    return ["--oracle", str(processes), "--checkpoints", _checkpoints_dir()]


def oracle_tensors(processes: int = 1, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """The reference backend on the combined batches of ``processes`` processes (computed once per process
    count in this Python process)."""
    if processes not in _oracle_counts:
        with tempfile.TemporaryDirectory(prefix="drivetrain-oracle-") as workdir:
            done = launch([*_oracle_args(processes), "--out", workdir], 1, workdir, timeout)
            _store_oracle(done, processes)
    return _oracle_cache


def _store_oracle(done: Launch, processes: int) -> None:
    import torch

    path = os.path.join(done.tensors_dir, "oracle.rank0.pt")
    if not os.path.exists(path):
        why = done.hang.describe() if done.hang is not None else done.output[-4000:]
        raise RuntimeError(f"the reference backend's oracle run failed:\n{why}")
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
                    "after unscaling; gradients must be averaged by the end of the synchronised backward, "
                    "since clipping reads them before optimizer.step()) and the optimizer step"
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
    prop: str,
    target_id: str,
    launch: Launch,
    processes: int,
    info: Any,
    results: dict[int, dict],
    on_local: Launch | None = None,
) -> Verdict:
    """The verdict on ``prop`` from every rank's result record (``results``) and the tensors they saved."""
    details = {}
    for rank in range(processes):
        mine = results.get(rank)
        if mine is None:
            why = f"exit code {launch.returncode}" if launch.returncode is not None else "stopped"
            return Verdict(prop, FAIL, f"no result from rank {rank} ({why}): {_tail(launch.output)}")
        if not mine["ok"]:
            prefix = f"rank {rank}: " if processes > 1 and not mine["detail"].startswith("rank ") else ""
            return Verdict(prop, FAIL, prefix + mine["detail"])
        details[rank] = mine["detail"]
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
    if launch.hang is not None:
        return Verdict("clean_exit", FAIL, launch.hang.describe(), _stacks_of(launch.hang))
    if launch.returncode != 0 or unfinished or "terminate called" in launch.output:
        what = f"exit code {launch.returncode}" + (
            f", ranks {unfinished} did not finish" if unfinished else ""
        )
        return Verdict("clean_exit", FAIL, f"{what}: {_tail(launch.output)}")
    return Verdict("clean_exit", PASS, f"exit code 0 on {processes} rank(s)")


def _stacks_of(hang: Hang) -> str:
    return "\n".join(
        f"rank {rank}, main thread (most recent call first):\n{stack}"
        for rank, stack in sorted(hang.stacks.items())
        if stack
    )


#: ``on_verdict(target, verdict, seconds)``: called as each verdict is known (seconds: the property's
#: duration on its slowest rank, None for verdicts that need no run)
VerdictCallback = Callable[[str, Verdict, "float | None"], None]


class _Run:
    """The verdicts of one :func:`run_suite` call, judged as the ranks' records come in."""

    def __init__(
        self,
        targets: list[str],
        static: dict[str, tuple[str | None, Any]],
        processes: int,
        workdir: str,
        on_verdict: VerdictCallback | None,
    ) -> None:
        self.targets, self.static, self.processes = targets, static, processes
        self.ids = {spec: f"t{index}" for index, spec in enumerate(targets)}
        self.spec_of = {target_id: spec for spec, target_id in self.ids.items()}
        self.on_verdict = on_verdict
        self.verdicts: dict[str, dict[str, Verdict]] = {spec: {} for spec in targets}
        #: (target id, property) -> rank -> the rank's result record
        self.results: dict[tuple[str, str], dict[int, dict]] = {}
        #: checkpoint_portable results waiting for the reference backend's resume launch
        self.deferred: set[str] = set()
        self.skipped: set[str] = set()  # target ids not to run again
        self.hangs: dict[str, list[str]] = {}
        #: stands for the launch in progress where verdicts read the saved tensors
        self.current = Launch(None, "", {}, workdir)

    def give(self, spec: str, verdict: Verdict, seconds: float | None = None) -> None:
        self.verdicts[spec][verdict.property] = verdict
        if self.on_verdict is not None:
            self.on_verdict(spec, verdict, seconds)

    def info(self, spec: str) -> Any:
        return self.static[spec][1]

    def remaining(self, spec: str) -> list[str]:
        """Worker properties of ``spec`` that apply here and have no verdict (nor a deferred one) yet."""
        return [
            prop
            for prop in WORKER_PROPERTIES
            if prop not in self.verdicts[spec]
            and not (prop == "checkpoint_portable" and spec in self.deferred)
            and not_applicable(prop, self.info(spec), self.processes) is None
        ]

    def record(self, rank: int, record: dict) -> None:
        """One record of a rank, as the launch writes it: judge a property once every rank reported it."""
        target_id, prop = record.get("target"), record.get("property")
        if prop == ORACLE_STEP and self.processes not in _oracle_counts:
            if os.path.exists(os.path.join(self.current.tensors_dir, "oracle.rank0.pt")):
                _store_oracle(self.current, 1)
            return
        spec = self.spec_of.get(target_id or "")
        if spec is None or prop not in WORKER_PROPERTIES or "ok" not in record:
            return
        results = self.results.setdefault((target_id, prop), {})
        results[rank] = record
        if len(results) < self.processes or prop in self.verdicts[spec]:
            return
        if prop == "checkpoint_portable" and all(r["ok"] for r in results.values()):
            self.deferred.add(spec)
            return
        verdict = _worker_verdict(prop, target_id, self.current, self.processes, self.info(spec), results)
        self.give(spec, verdict, max(r.get("seconds", 0.0) for r in results.values()))

    def skip_arguments(self) -> list[str]:
        pairs = []
        for spec, target_id in self.ids.items():
            if target_id in self.skipped or not self.remaining(spec):
                pairs.append(f"{target_id}:*")
            else:
                pairs += [
                    f"{target_id}:{prop}" for prop in WORKER_PROPERTIES if prop not in self.remaining(spec)
                ]
        return ["--skip", ",".join(pairs)] if pairs else []

    def fail_remaining(self, spec: str, reason: str, stacks: str = "") -> None:
        for index, prop in enumerate(self.remaining(spec)):
            self.give(spec, Verdict(prop, FAIL, reason, stacks if index == 0 else ""))  # the stacks once
        self.skipped.add(self.ids[spec])

    def after_hang(self, hang: Hang) -> bool:
        """Turn a hang into verdicts; whether the next launch should go on with what is left."""
        spec = self.spec_of.get(hang.target)
        stacks = _stacks_of(hang)
        if hang.step == SHUTDOWN_STEP:
            return False  # every property was judged; clean_exit reports the hang
        if spec is None or hang.step in (START_STEP, ORACLE_STEP):
            what = "the processes did not start" if hang.step == START_STEP else "the reference backend hung"
            for each in self.targets:
                if self.info(each) is not None:
                    self.fail_remaining(each, f"not run: {what}: {hang.describe()}", stacks)
            return False
        if hang.step in WORKER_PROPERTIES:
            self.give(spec, Verdict(hang.step, FAIL, hang.describe(), stacks), hang.limit)
            self.hangs.setdefault(spec, []).append(hang.step)
            if len(self.hangs[spec]) >= HANGS_PER_BACKEND:
                self.fail_remaining(
                    spec,
                    f"not run: the backend hung {len(self.hangs[spec])} times (in {', '.join(self.hangs[spec])}); "
                    "fix those first",
                )
            return True
        where = "starting the backend" if hang.step == SETUP_STEP else f"between properties ({hang.step})"
        self.fail_remaining(spec, f"not run: the backend hung while {where}: {hang.describe()}", stacks)
        return True


def run_suite(
    targets: list[str],
    processes: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    workdir: str | None = None,
    plugins: tuple[str, ...] = (),
    on_verdict: VerdictCallback | None = None,
) -> dict[str, Report]:
    """Check every backend in ``targets`` (installed plugin names or ``.py`` files) with ``processes``
    processes in one launch. Returns a :class:`Report` per target, keyed by the target as given.

    ``timeout`` limits each property (seconds): one that runs longer is reported as a hang, naming where each
    rank waits, and a new launch goes on with the properties not yet judged. ``on_verdict(target, verdict,
    seconds)`` is called as each verdict is known (the CLI prints them as they come).

    ``plugins`` are named by every Accelerator the checks build (``Accelerator(plugins=[...])``), so a device
    or feature plugin is checked over each backend, against the oracle of the reference backend alone."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    manager = get_plugin_registry()
    for name in plugins:  # one installed for the launched processes only is checked there
        problem = unusable_plugin(name, manager.info(name)) if name in manager.discovered() else None
        if problem is not None:
            raise ValueError(problem)
    with tempfile.TemporaryDirectory(prefix="drivetrain-conformance-") as scratch:
        workdir = workdir or scratch
        static = {spec: check_spec(spec) for spec in targets}
        run = _Run(targets, static, processes, workdir, on_verdict)
        for spec in targets:
            problem, info = static[spec]
            run.give(spec, Verdict("hooks_match_spec", FAIL if problem else PASS, problem or ""))
            for prop in PROPERTIES[1:]:
                if info is None:
                    run.give(spec, Verdict(prop.name, FAIL, "not run: the backend did not load"))
                elif (reason := not_applicable(prop.name, info, processes)) is not None:
                    run.give(spec, Verdict(prop.name, NOT_APPLICABLE, reason))
        launched = [spec for spec in targets if static[spec][1] is not None and run.remaining(spec)]
        args = ["--out", workdir, "--checkpoints", _checkpoints_dir()]
        args += ["--targets", ",".join(f"{run.ids[spec]}={spec}" for spec in launched)]
        if plugins:
            args += ["--plugins", ",".join(plugins)]
        final = Launch(0, "", {rank: [{"finished": True}] for rank in range(processes)}, workdir)
        on_local = None
        if launched:
            # One process: the oracle runs first in the same launch (a launch costs seconds of start-up).
            with_oracle = processes == 1 and processes not in _oracle_counts
            if not with_oracle:
                oracle_tensors(processes, timeout)
            for number in range(len(WORKER_PROPERTIES) * len(launched) + 1):
                oracle = ["--oracle", "1"] if with_oracle and 1 not in _oracle_counts else []
                final = launch(
                    args + oracle + run.skip_arguments(), processes, workdir, timeout, number, run.record
                )
                run.current = final
                if oracle and final.hang is None and 1 not in _oracle_counts:
                    _store_oracle(final, processes)  # raises, with the launch's output: the oracle failed
                if final.hang is None or not run.after_hang(final.hang):
                    break
            for spec in launched:  # a rank that crashed leaves properties without every rank's result
                for prop in run.remaining(spec):
                    results = run.results.get((run.ids[spec], prop), {})
                    run.give(
                        spec, _worker_verdict(prop, run.ids[spec], final, processes, run.info(spec), results)
                    )
            portable = [
                spec for spec in launched if os.path.isdir(os.path.join(workdir, f"portable-{run.ids[spec]}"))
            ]
            if portable:
                # Every portable backend's checkpoint resumed by the reference backend, in one more launch.
                resume_dir = os.path.join(workdir, "on-local")
                os.makedirs(resume_dir)
                pairs = ",".join(
                    f"{run.ids[spec]}={os.path.join(workdir, 'portable-' + run.ids[spec])}"
                    for spec in portable
                )
                on_local = launch(
                    ["--out", resume_dir, "--resume-on-local", pairs, "--as-processes", str(processes)],
                    1,
                    resume_dir,
                    timeout,
                )
            for spec in sorted(run.deferred, key=targets.index):
                target_id = run.ids[spec]
                results = run.results[(target_id, "checkpoint_portable")]
                if on_local is not None and on_local.hang is not None and on_local.hang.target == target_id:
                    verdict = Verdict(
                        "checkpoint_portable",
                        FAIL,
                        f"the reference backend hung resuming this backend's checkpoint: {on_local.hang.describe()}",
                        _stacks_of(on_local.hang),
                    )
                else:
                    verdict = _worker_verdict(
                        "checkpoint_portable", target_id, final, processes, run.info(spec), results, on_local
                    )
                    recipe = run.verdicts[spec].get("adamw_schedule_matches_local")
                    if verdict.status == FAIL and recipe is not None and recipe.status == FAIL:
                        reason = f"{verdict.reason} (adamw_schedule_matches_local, whose training this resumes, fails too: fix it first)"
                        verdict = attrs.evolve(verdict, reason=reason)
                run.give(spec, verdict)
        reports = {}
        for spec in targets:
            if static[spec][1] is not None and "clean_exit" not in run.verdicts[spec]:
                run.give(spec, _exit_verdict(final, processes))
            verdicts = [run.verdicts[spec][prop.name] for prop in PROPERTIES]
            reports[spec] = Report(target_name(spec), processes, verdicts, tuple(plugins))
        return reports
