"""The script the runner launches (one process, or N under torch.distributed.run).

For every target it runs each applicable worker property and appends one JSON line per property to
``OUT/rank<R>.jsonl``; tensors the runner compares with the oracle go to ``OUT/<id>.rank<R>.pt``. A final
``{"finished": true}`` line tells the runner this rank reached the end (the clean_exit property).
"""

from __future__ import annotations

import argparse
import json
import os
import traceback


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
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from drivetrain.plugin_api.state import PartialState, reset_state
    from drivetrain_conformance import checks
    from drivetrain_conformance.properties import WORKER_PROPERTIES, not_applicable
    from drivetrain_conformance.targets import load_target

    rank = int(os.environ.get("RANK", "0"))
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    results_path = os.path.join(args.out, f"rank{rank}.jsonl")

    def emit(record: dict) -> None:
        with open(results_path, "a") as stream:
            stream.write(json.dumps(record) + "\n")

    if args.oracle:
        ctx = checks.Context("local", None, args.out)
        checks.oracle(ctx, tuple(int(n) for n in args.oracle.split(",")), args.checkpoints)
        torch.save(ctx.tensors, os.path.join(args.out, f"oracle.rank{rank}.pt"))

    for pair in filter(None, args.resume_on_local.split(",")):
        target_id, folder = pair.split("=", 1)
        reset_state()
        ctx = checks.Context("local", None, args.out)
        try:
            checks.resume_on_local(ctx, folder, args.as_processes)
            torch.save(ctx.tensors, os.path.join(args.out, f"{target_id}.on-local.pt"))
        except Exception as exc:
            emit({"target": target_id, "on_local": f"{type(exc).__name__}: {' '.join(str(exc).split())}"})

    for pair in filter(None, args.targets.split(",")):
        target_id, spec = pair.split("=", 1)
        reset_state()
        try:
            name, module = load_target(spec)
            from drivetrain.plugin_api import PluginInfo

            info = getattr(module, "PLUGIN_INFO", None) or PluginInfo(kind="backend")
            ctx = checks.Context(
                name,
                info,
                args.out,
                tuple(filter(None, args.plugins.split(","))),
                target_id=target_id,
                oracle_checkpoints=args.checkpoints,
            )
        except Exception as exc:
            for prop in WORKER_PROPERTIES:
                emit(
                    {
                        "target": target_id,
                        "property": prop,
                        "ok": False,
                        "detail": f"not run: the backend did not start: {type(exc).__name__}: {exc}",
                    }
                )
            continue
        done: dict = {}
        for prop in WORKER_PROPERTIES:
            if not_applicable(prop, info, processes) is not None:
                continue
            check = checks.CHECKS[prop]
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
            emit({"target": target_id, "property": prop, "ok": ok, "detail": detail})
        torch.save(ctx.tensors, os.path.join(args.out, f"{target_id}.rank{rank}.pt"))

    # Ranks meet and the process group goes away, as every script should end (end_training()).
    PartialState(cpu=True).destroy_process_group()
    emit({"finished": True})


if __name__ == "__main__":
    main()
