"""What the suite checks, when a property applies to a backend, and the tolerances it allows.

A property either runs in the parent process (``static``), inside the launched worker processes
(``worker``), or is judged from the launch itself (``launch``). A property outside a backend's declared
capabilities is reported as not applicable, with the reason, never skipped silently.
"""

from __future__ import annotations

import attrs

from drivetrain.plugin_api import PluginInfo

#: Seconds one property may run (``--timeout``, ``run_suite(timeout=...)``) before the suite reports it as a hang
#: and goes on with the next: well above the slowest property of an in-tree backend on a loaded 2-core machine
#: (docs/conformance.md gives the measured times).
DEFAULT_TIMEOUT = 120.0
#: Mixed-precision modes the reference backend ``local`` runs, hence the ones the suite has an oracle for.
REFERENCE_PRECISIONS = ("no", "bf16", "fp16")


@attrs.define(frozen=True)
class Tolerance:
    """``|candidate - oracle| <= atol + rtol * |oracle|`` element-wise."""

    rtol: float
    atol: float


#: Allowed difference between N-process training and one process on the combined batch, per precision.
#: fp32 differs only by summation order (all-reduce vs one big batch); bf16/fp16 round every matmul and,
#: for backends that compress gradients, the all-reduced gradients too. Measured margins are in
#: docs/conformance.md.
TOLERANCES = {
    "no": Tolerance(rtol=1e-4, atol=1e-5),
    "bf16": Tolerance(rtol=1e-2, atol=5e-3),
    "fp16": Tolerance(rtol=1e-3, atol=1e-3),
    # Backends declaring low_precision_weights keep bf16 weights (one bf16 ulp of a weight near 1 is 8e-3).
    "bf16-weights": Tolerance(rtol=2e-2, atol=3e-2),
}


def tolerance_for(precision: str, info: PluginInfo | None) -> Tolerance:
    """The tolerance for training in ``precision`` with a backend declaring ``info``."""
    if precision == "bf16" and info is not None and info.capabilities.low_precision_weights:
        return TOLERANCES["bf16-weights"]
    return TOLERANCES[precision]


@attrs.define(frozen=True)
class Property:
    name: str
    summary: str
    #: "static" (parent process), "worker" (inside the launched processes) or "launch" (the launch's outcome)
    where: str


PROPERTIES = (
    Property(
        "hooks_match_spec", "hook implementations and PLUGIN_INFO validate against the contract", "static"
    ),
    Property("one_process_matches_local", "one-process training equals the reference backend", "worker"),
    Property(
        "multi_process_matches_combined_batch",
        "N-process training equals one process on the combined batch (per-precision tolerance)",
        "worker",
    ),
    Property(
        "prepare_synchronises_weights",
        "processes seeded differently before building the model all hold process 0's initial weights after "
        "prepare",
        "worker",
    ),
    Property(
        "adamw_schedule_matches_local",
        "AdamW + an LR scheduler + gradient accumulation + clipping, in each declared precision, equals the "
        "reference backend on the combined batch: weights, learning rates and (where every process holds it) "
        "AdamW's state",
        "worker",
    ),
    Property(
        "gradient_accumulation",
        "accumulate(): steps only at boundaries and at the loader's end; equals the full batch",
        "worker",
    ),
    Property(
        "no_sync",
        "gradients stay local inside no_sync() and on accumulation's non-boundary steps; the "
        "next synchronised backward averages everything accumulated",
        "worker",
    ),
    Property(
        "collectives",
        "gather, gather_object, broadcast, reduce, pad_across_processes, "
        "split_between_processes, triggers and gather_for_metrics give their documented results",
        "worker",
    ),
    Property("dataloader_modes", "every data loader mode covers the data exactly once", "worker"),
    Property(
        "checkpoint_resume", "save_state -> load_state -> continue equals the uninterrupted run", "worker"
    ),
    Property(
        "checkpoint_portable",
        "a checkpoint saved here resumes on the reference backend, and a reference checkpoint resumes here, "
        "both equal to the uninterrupted reference run (portable_checkpoints=True)",
        "worker",
    ),
    Property(
        "checkpoint_per_process_state",
        "a checkpoint saved while the processes hold different state (random state, loader position, "
        "optimizer shard, weights diverged under no_sync) loads back into each process as its own; the model "
        "files hold the main process's (consolidated) model",
        "worker",
    ),
    Property(
        "sharded_state",
        "the sharded_state declaration matches what the processes hold: part of the state on some process, "
        "or all of it on every process",
        "worker",
    ),
    Property(
        "join_uneven_inputs",
        "a backend declaring joinable=True prepares torch Joinables: processes training different numbers of "
        "batches under join_uneven_inputs all finish, holding the same weights",
        "worker",
    ),
    Property("unwrap_model", "unwrap_model returns the user's module, holding the trained weights", "worker"),
    Property("autocast", "autocast() computes in the requested dtype; prepared models return fp32", "worker"),
    Property(
        "second_accelerator", "a second Accelerator in the same process works beside the first", "worker"
    ),
    Property("clean_exit", "every rank exits with code 0 after end_training()", "launch"),
)
PROPERTY_NAMES = tuple(prop.name for prop in PROPERTIES)
WORKER_PROPERTIES = tuple(prop.name for prop in PROPERTIES if prop.where == "worker")


def unusable_plugin(name: str, info: PluginInfo) -> str | None:
    """Why the suite cannot check plugin ``name`` over a backend (``--plugins``), or None. A precision plugin
    acts only for the ``mixed_precision`` values it provides; named for every run, it would convert runs the
    reference backend makes in other precisions."""
    if info.kind == "precision" and not set(info.precisions) & set(REFERENCE_PRECISIONS):
        return (
            f"plugin {name!r} provides mixed_precision {', '.join(info.precisions)}, for which the suite has no "
            f"reference (it checks {', '.join(REFERENCE_PRECISIONS)}); named with --plugins it would act on "
            "every run. Its own tests check it against training without it"
        )
    return None


def checked_precisions(info: PluginInfo) -> tuple[str, ...]:
    """Declared precisions the suite can check (those the reference backend also runs)."""
    return tuple(p for p in info.capabilities.precisions if p in REFERENCE_PRECISIONS)


def not_applicable(name: str, info: PluginInfo, processes: int) -> str | None:
    """Why property ``name`` does not apply to a backend declaring ``info`` at ``processes``; None if it does."""
    if name == "hooks_match_spec":
        return None
    caps = info.capabilities
    if processes > 1 and not caps.multi_process:
        return f"the backend declares multi_process=False; run it with --processes 1 (asked for {processes})"
    if "cpu" not in caps.devices:
        return f"the suite runs on CPU and the backend declares devices={list(caps.devices)}"
    if name == "one_process_matches_local" and processes != 1:
        return f"checked with --processes 1 (this run uses {processes})"
    if name == "multi_process_matches_combined_batch":
        if not caps.multi_process:
            return "the backend declares multi_process=False"
        if processes < 2:
            return "needs --processes 2 or more"
    if name == "checkpoint_portable" and not caps.portable_checkpoints:
        return "the backend declares portable_checkpoints=False (its checkpoints load only on itself)"
    if name == "join_uneven_inputs" and not caps.joinable:
        return "the backend declares joinable=False: join_uneven_inputs runs its block without torch's Join"
    if name in ("sharded_state", "prepare_synchronises_weights", "join_uneven_inputs") and processes < 2:
        return "needs --processes 2 or more"
    if name == "no_sync" and not caps.local_gradients:
        return (
            "the backend declares local_gradients=False: gradients between synchronisations are not kept "
            "in param.grad, so no_sync cannot be observed there (its own tests check accumulation)"
        )
    if name in (
        "one_process_matches_local",
        "multi_process_matches_combined_batch",
        "adamw_schedule_matches_local",
        "autocast",
    ):
        if not checked_precisions(info):
            return (
                f"the backend declares precisions {list(caps.precisions)}, none of which the reference "
                f"backend runs ({', '.join(REFERENCE_PRECISIONS)})"
            )
    return None
