"""The script the runner launches (one process, or N under torch.distributed.run).

For every target it runs each applicable worker property and appends JSON lines to ``OUT/rank<R>.jsonl``:
``{"started": ...}`` before a step (a property, the oracle, a backend's set-up) and its result after, so that
the runner prints each verdict as it comes and knows where a rank hangs. Tensors the runner compares with the
oracle go to ``OUT/<id>.rank<R>.pt`` after every property (a launch stopped after a hang keeps what was
done; the next launch of the same target starts from them). A final ``{"finished": true}`` line tells the
runner this rank reached the end (the clean_exit property).

The first line is ``{"pid": ...}``: on a hang the runner sends that process SIGUSR1, and faulthandler writes
the stacks of its threads to ``OUT/stacks.<launch>.rank<R>.txt``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import time
import traceback
from typing import Any

#: Steps that are not properties, as the records name them.
ORACLE_STEP = "(oracle)"
SETUP_STEP = "(set-up)"
RESUME_STEP = "(resume on local)"
SHUTDOWN_STEP = "(shutdown)"


def run_properties(ctx: Any, target_id: str, properties: list[str]) -> None:
    """Run each applicable property of ``properties`` on the backend of ``ctx``: a started record, the
    tensors it recorded (saved whole), then its result record."""
    import torch

    from drivetrain_conformance import checks
    from drivetrain_conformance.properties import not_applicable

    tensors_path = os.path.join(ctx.workdir, f"{target_id}.rank{ctx.rank}.pt")
    if os.path.exists(tensors_path):  # what an earlier launch of this target recorded before it hung
        ctx.tensors.update(torch.load(tensors_path, weights_only=False))
    done: dict = {}
    for prop in properties:
        if not_applicable(prop, ctx.info, ctx.processes) is not None:
            continue
        check = checks.CHECKS[prop]
        since = started(ctx.workdir, target_id, prop)
        try:
            if check not in done:
                done[check] = (True, check(ctx))
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = (
                str(exc)
                if isinstance(exc, checks.PropertyFailure)
                else (
                    f"raised {type(exc).__name__}: {exc} (at {os.path.basename(where.filename)}:"
                    f"{where.lineno}) while {checks.DOING.get(prop, 'running the check')}"
                )
            )
            done[check] = (False, " ".join(detail.split()))
        ok, detail = done[check]
        # Replaced whole: the runner may be reading the previous version for another property's verdict.
        torch.save(ctx.tensors, tensors_path + ".partial")
        os.replace(tensors_path + ".partial", tensors_path)
        seconds = time.monotonic() - since
        emit(
            ctx.workdir,
            {"target": target_id, "property": prop, "ok": ok, "detail": detail, "seconds": seconds},
        )


def emit(out: str, record: dict) -> None:
    """Append ``record`` to this rank's record file, one line written at once."""
    with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.jsonl"), "a") as stream:
        stream.write(json.dumps(record) + "\n")


def started(out: str, target: str, step: str) -> float:
    emit(out, {"target": target, "property": step, "started": True})
    return time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", default="", help="comma-separated id=spec pairs")
    parser.add_argument(
        "--oracle", default="", help="first run the reference backend's oracle for these process counts (1,2)"
    )
    parser.add_argument(
        "--checkpoints", default=None, help="folder of the oracle's recipe checkpoints (checkpoint_portable)"
    )
    parser.add_argument(
        "--resume-on-local",
        default="",
        help="comma-separated id=folder pairs: resume each backend checkpoint with the reference backend",
    )
    parser.add_argument("--as-processes", type=int, default=1, help="process count the checkpoints came from")
    parser.add_argument(
        "--plugins", default="", help="comma-separated plugins every checked Accelerator names"
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated id:property pairs already judged by an earlier launch (id:* for all of them)",
    )
    parser.add_argument("--launch", default="0", help="this launch's number (names the stack dump files)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    out = args.out
    # Before torch is imported: a hang in the imports or the set-up is dumped too. The file stays open for
    # the life of the process (faulthandler writes to its descriptor from the signal handler).
    stacks = open(os.path.join(out, f"stacks.{args.launch}.rank{rank}.txt"), "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    emit(out, {"pid": os.getpid(), "launch": args.launch})

    import torch

    torch.set_num_threads(1)
    from drivetrain.plugin_api import PluginInfo
    from drivetrain.plugin_api.state import PartialState, reset_state
    from drivetrain_conformance import checks
    from drivetrain_conformance.properties import WORKER_PROPERTIES
    from drivetrain_conformance.targets import load_target

    skipped = set(filter(None, args.skip.split(",")))

    def finished(target: str, step: str, since: float, ok: bool = True) -> None:
        emit(out, {"target": target, "property": step, "ok": ok, "seconds": time.monotonic() - since})

    if args.oracle:
        since = started(out, "", ORACLE_STEP)
        ctx = checks.Context("local", None, out)
        checks.oracle(ctx, tuple(int(n) for n in args.oracle.split(",")), args.checkpoints)
        torch.save(ctx.tensors, os.path.join(out, f"oracle.rank{rank}.pt"))
        finished("", ORACLE_STEP, since)

    for pair in filter(None, args.resume_on_local.split(",")):
        target_id, folder = pair.split("=", 1)
        since = started(out, target_id, RESUME_STEP)
        reset_state()
        ctx = checks.Context("local", None, out)
        try:
            checks.resume_on_local(ctx, folder, args.as_processes)
            torch.save(ctx.tensors, os.path.join(out, f"{target_id}.on-local.pt"))
        except Exception as exc:
            emit(
                out, {"target": target_id, "on_local": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            )
        finished(target_id, RESUME_STEP, since)

    for pair in filter(None, args.targets.split(",")):
        target_id, spec = pair.split("=", 1)
        if f"{target_id}:*" in skipped:
            continue
        since = started(out, target_id, SETUP_STEP)
        reset_state()
        try:
            name, module = load_target(spec)
            info = getattr(module, "PLUGIN_INFO", None) or PluginInfo(kind="backend")
            plugins = tuple(filter(None, args.plugins.split(",")))
            ctx = checks.Context(
                name, info, out, plugins, target_id=target_id, oracle_checkpoints=args.checkpoints
            )
        except Exception as exc:
            finished(target_id, SETUP_STEP, since, ok=False)
            why = f"not run: the backend did not start: {type(exc).__name__}: {exc}"
            for prop in WORKER_PROPERTIES:
                emit(out, {"target": target_id, "property": prop, "ok": False, "detail": why})
            continue
        finished(target_id, SETUP_STEP, since)
        # The oracle never clips but where the recipe asks: a backend whose optimizer clips by a setting of
        # its own runs with it off (the recipe turns it on).
        with checks.clipping_setting(info, 0.0):
            run_properties(
                ctx, target_id, [p for p in WORKER_PROPERTIES if f"{target_id}:{p}" not in skipped]
            )

    # Ranks meet and the process group goes away, as every script should end (end_training()).
    started(out, "", SHUTDOWN_STEP)
    PartialState(cpu=True).destroy_process_group()
    emit(out, {"finished": True})


if __name__ == "__main__":
    main()
