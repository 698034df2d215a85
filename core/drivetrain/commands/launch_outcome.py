"""Running a launch's processes under torch's elastic launcher, and saying in one line how they ended.

``drivetrain launch`` resolves its settings (launch_plan.py), then launch.py calls :func:`run_job`, which:

- listens on the launch channel (launch_channel.py) for the processes' failures and the backend they used,
  so that nothing is written to the temporary folder (a killed launcher could not remove it);
- runs torch's launcher, whose per-run log folders go to ``/dev/null`` unless ``--log_dir`` names one;
- turns how the job ended into one line: the rank that failed first and its error (the processes' other
  tracebacks stay in the failure report, which ``--debug`` prints), or the signal that stopped it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from drivetrain.commands.parsing import error_line
from drivetrain.launch_channel import LaunchChannel


def run_job(torchrun_argv: list[str], *, debug: bool, announced: str | None) -> int:
    """Run the job that ``torchrun_argv`` describes (torchrun's own command line) and return the exit code.
    ``announced`` is the backend the banner named (None when no banner was printed): when process 0 used
    another, a line after the run says so."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    with LaunchChannel() as channel:
        os.environ.update(channel.environment)
        try:
            torchrun.run(torchrun.parse_args(torchrun_argv))
        except ChildFailedError as exc:
            recorded = channel.first_failure()
            if debug:
                print(exc.format_msg(), file=sys.stderr)
                print(failure_report_text(channel, recorded), file=sys.stderr, end="")
            kept = any(record is not recorded for record in channel.failures)
            print(error_line(failure_message(exc, recorded, debug, kept)), file=sys.stderr)
            return exit_code_of(exc, recorded)
        except SignalException as exc:
            # The launcher was told to stop (SIGTERM from a scheduler, SIGINT ...): torch stopped the processes.
            if debug:
                print(failure_report_text(channel, None), file=sys.stderr, end="")
            name = signal_name(int(exc.sigval))
            print(error_line(f"stopped by {name}: the job's processes were stopped"), file=sys.stderr)
            return 128 + int(exc.sigval)
        finally:
            for variable in channel.environment:
                os.environ.pop(variable, None)
            if announced is not None and channel.backend is not None:
                used = used_backend_line(announced, *channel.backend)
                if used:
                    print(used, file=sys.stderr, flush=True)
    return 0


def used_backend_line(announced: str, name: str, source: str) -> str | None:
    """``drivetrain launch: the script used backend X (from ...)`` when the processes used another backend
    than the banner announced (the script chose one itself), else None."""
    if not name or name == announced.split(" ")[0]:
        return None
    return f"drivetrain launch: the script used backend {name} (from {source}), not {announced}"


def failure_report_text(channel: LaunchChannel, shown: dict[str, Any] | None) -> str:
    """Every process's error and traceback, as they reached the launcher, but the one already printed."""
    lines = []
    for record in channel.failures:
        if record is shown or not record["traceback"]:
            continue
        attempt = f", attempt {record['attempt']}" if record["attempt"] else ""
        lines.append(f"--- process of global rank {record['rank']}{attempt}: {record['error']}\n")
        lines.append(record["traceback"].rstrip("\n") + "\n")
    return "".join(lines)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _exit_code(exitcode: int) -> int:
    """A process's exit code as a shell reports it: 128 + N for one killed by signal N."""
    return exitcode if exitcode > 0 else 128 - exitcode


def _blamed_rank(exc: Any, recorded: dict[str, Any] | None) -> int:
    """The rank that failed first: the first Python error that reached the launcher; else a rank that
    exited with an error code rather than one killed by a signal (killed ones are usually stopped because
    another failed); else torch's pick."""
    if recorded is not None and recorded["rank"] in exc.failures:
        return int(recorded["rank"])
    exited = sorted(rank for rank, failure in exc.failures.items() if failure.exitcode > 0)
    if exited:
        return exited[0]
    rank, _ = exc.get_first_failure()
    return int(rank)


def exit_code_of(exc: Any, recorded: dict[str, Any] | None) -> int:
    return _exit_code(exc.failures[_blamed_rank(exc, recorded)].exitcode)


def failure_message(exc: Any, recorded: dict[str, Any] | None, debug: bool, others_kept: bool = False) -> str:
    """The one line; ``others_kept``: other processes' tracebacks are in the failure report, not printed."""
    rank = _blamed_rank(exc, recorded)
    failure = exc.failures[rank]
    how = (
        f"exit code {failure.exitcode}"
        if failure.exitcode > 0
        else f"signal {signal_name(-failure.exitcode)}"
    )
    others = sorted(other for other in exc.failures if other != rank)
    after = (
        f"; rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed after it"
        if others
        else ""
    )
    if recorded is not None and recorded["rank"] == rank:
        kept = " (--debug prints their tracebacks)" if others_kept and not debug else ""
        return f"process of global rank {rank} failed first ({how}): {recorded['error']}{after}{kept}"
    hint = "" if debug else " (--debug shows the launcher's report)"
    return (
        f"process of global rank {rank} failed first ({how}) without a Python error "
        f"(its output above is all there is){after}{hint}"
    )
