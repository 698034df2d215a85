"""The properties N-D layouts must keep (``ParallelismConfig``), for backends that declare
``Capabilities.mesh_dimensions``. Kept apart from the main suite (properties.py, runner.py): it launches its own
processes, one launch per backend, every layout of that backend in it (``reset_state`` between layouts).

For ``processes`` N the layouts are: each declared dimension alone with size N, and with N = 4 each pair of
declared dimensions as 2 x 2. The checks are in nd_checks.py; each verdict is named
``<property>[<layout>]``.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile

from drivetrain.plugin_api import PluginInfo
from drivetrain_conformance.properties import Property
from drivetrain_conformance.runner import FAIL, NOT_APPLICABLE, PASS, Report, Verdict

ND_PROPERTIES = (
    Property("nd_mesh", "the run's DeviceMesh has the layout's dimensions and sizes", "worker"),
    Property(
        "nd_data_parallel_shares",
        "the ranks of one tensor/context-parallel group see the same batches; the data-parallel shares "
        "split the data, each sample once",
        "worker",
    ),
    Property("nd_gather_for_metrics", "gather_for_metrics returns each sample once", "worker"),
    Property(
        "nd_training_matches_local",
        "training on the layout equals the reference backend on the combined batch",
        "worker",
    ),
    Property(
        "nd_checkpoint_resume", "save_state -> load_state -> continue equals the uninterrupted run", "worker"
    ),
    Property(
        "nd_undeclared_dimension_refused",
        "a dimension the backend does not declare is refused, naming the size and the backend",
        "worker",
    ),
)
DIMENSIONS = ("dp_replicate", "dp_shard", "cp", "tp")


def layouts(info: PluginInfo, processes: int) -> list[dict[str, int]]:
    """The layouts checked for a backend declaring ``info`` on ``processes`` processes."""
    declared = [name for name in DIMENSIONS if name in (info.capabilities.mesh_dimensions or ())]
    found = [{f"{name}_size": processes} for name in declared] if processes > 1 else []
    if processes == 4:
        found += [{f"{a}_size": 2, f"{b}_size": 2} for a, b in itertools.combinations(declared, 2)]
    return found


def not_applicable(info: PluginInfo, processes: int) -> str | None:
    if info.capabilities.mesh_dimensions is None:
        return "the backend declares no mesh_dimensions (contract 1.1 plugins): it checks ParallelismConfig itself"
    if processes < 2:
        return "needs --processes 2 or more"
    if not info.capabilities.multi_process:
        return "the backend declares multi_process=False"
    return None


def run_nd_suite(backend: str, info: PluginInfo, processes: int = 2, timeout: float = 600) -> Report:
    """Every N-D property of ``backend`` (an installed plugin name) on ``processes`` processes, one launch."""
    from drivetrain.testing import launch_script

    reason = not_applicable(info, processes)
    if reason is not None:
        return Report(
            backend, processes, [Verdict(prop.name, NOT_APPLICABLE, reason) for prop in ND_PROPERTIES]
        )
    checked = layouts(info, processes)
    undeclared = next((name for name in DIMENSIONS if name not in info.capabilities.mesh_dimensions), "")
    with tempfile.TemporaryDirectory(prefix="drivetrain-nd-conformance-") as workdir:
        args = ["--out", workdir, "--backend", backend, "--layouts", json.dumps(checked)]
        if undeclared:
            args += ["--undeclared", undeclared]
        script = os.path.join(os.path.dirname(__file__), "nd_checks.py")
        done = launch_script(script, processes, args, env={"TMPDIR": workdir}, timeout=timeout, check=False)
        records = []
        for rank in range(processes):
            path = os.path.join(workdir, f"nd.rank{rank}.jsonl")
            records.append([json.loads(line) for line in open(path)] if os.path.exists(path) else [])
    output = (done.stdout + done.stderr).strip().splitlines()[-4:]
    verdicts = []
    from drivetrain_conformance.nd_checks import CHECKS, layout_name

    for sizes in checked:
        for prop in CHECKS:
            verdicts.append(
                _verdict(f"{prop}[{layout_name(sizes)}]", layout_name(sizes), prop, records, output)
            )
    if undeclared:
        verdicts.append(
            _verdict(
                "nd_undeclared_dimension_refused", "-", "nd_undeclared_dimension_refused", records, output
            )
        )
    else:
        verdicts.append(
            Verdict("nd_undeclared_dimension_refused", NOT_APPLICABLE, "the backend declares every dimension")
        )
    return Report(backend, processes, verdicts)


def _verdict(name: str, layout: str, prop: str, records: list[list[dict]], output: list[str]) -> Verdict:
    for rank, mine in enumerate(records):
        found = [r for r in mine if r.get("layout") == layout and r.get("property") == prop]
        if not found:
            return Verdict(name, FAIL, f"no result from rank {rank}: {' | '.join(output)}")
        if not found[0]["ok"]:
            return Verdict(name, FAIL, f"rank {rank}: {found[0]['detail']}")
    return Verdict(
        name,
        PASS,
        next(r["detail"] for r in records[0] if r.get("layout") == layout and r.get("property") == prop),
    )
