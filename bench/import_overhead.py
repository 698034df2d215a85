"""Import cost: `import drivetrain` against `import torch`, in CPU time of a whole fresh process.

    python bench/import_overhead.py [--repeats 15] [--reference-python /tmp/ref-venv/bin/python]
                                    [--compare-core /tmp/old/core]

Prints the median CPU time (user + system) of each and the median of the per-round ratios (the three
statements run in turn each round). Also times, inside one fresh process each, ``import torch`` and then the
package on top of it: the steadiest figure on a shared machine (no start-up, shutdown or between-process
variance). With --reference-python, also times ``import accelerate`` in that interpreter (a separate virtual
environment with accelerate installed). With --compare-core, also times the in-process measure for another
drivetrain tree (the ``core`` folder of another checkout, e.g. ``git archive <commit> core | tar -x -C
/tmp/old``), its rounds interleaved with this tree's, so that a change is measured under the same load.
Target (issue 2): drivetrain <= 1.03x torch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys


def child_environment(pythonpath: str | None = None) -> dict[str, str]:
    """One thread, and bytecode written and reused (an installed package has it; with PYTHONDONTWRITEBYTECODE
    set, every run would compile drivetrain's sources again and time that)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def cpu_time(python: str, statement: str) -> float:
    """CPU seconds (user + system) that a fresh interpreter spends running ``statement``."""
    before = os.times()
    subprocess.run([python, "-c", statement], check=True, env=child_environment())
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


_IN_PROCESS = """
import time
start = time.process_time()
import torch
after_torch = time.process_time()
{statement}
print(after_torch - start, time.process_time() - after_torch)
"""


def on_top_ratio(python: str, statement: str, pythonpath: str | None = None) -> float:
    """(import torch + ``statement``) / (import torch), both timed inside one fresh process: start-up,
    shutdown and the variance between two processes drop out, which on a shared machine are larger than the
    few percent being measured."""
    output = subprocess.run(
        [python, "-c", _IN_PROCESS.format(statement=statement)],
        check=True,
        capture_output=True,
        text=True,
        env=child_environment(pythonpath),
    ).stdout
    torch_seconds, statement_seconds = map(float, output.split()[-2:])
    return (torch_seconds + statement_seconds) / torch_seconds


def cost_on_top_of_torch(python: str, statement: str, repeats: int) -> float:
    """Median of :func:`on_top_ratio` over ``repeats`` fresh processes."""
    return statistics.median(on_top_ratio(python, statement) for _ in range(repeats))


def median_time(python: str, statement: str, repeats: int) -> float:
    cpu_time(python, statement)  # warm the file cache
    return statistics.median(cpu_time(python, statement) for _ in range(repeats))


def drivetrain_file() -> str:
    """Where this interpreter imports drivetrain from (without importing it into the bench process)."""
    output = subprocess.run(
        [sys.executable, "-c", "import drivetrain; print(drivetrain.__file__)"],
        check=True,
        capture_output=True,
        text=True,
    )
    return output.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--reference-python", default=None)
    parser.add_argument("--compare-core", default=None, help="another drivetrain tree's core folder")
    args = parser.parse_args()
    # Interleave measurements so machine load affects all alike; ratios are taken per round.
    statements = {
        "torch": "import torch",
        "ours": "import drivetrain",
        "full": "from drivetrain import Accelerator",
    }
    times: dict[str, list[float]] = {name: [] for name in statements}
    cpu_time(sys.executable, "from drivetrain import Accelerator")  # warm the file cache
    for _ in range(args.repeats):
        for name, statement in statements.items():
            times[name].append(cpu_time(sys.executable, statement))

    def ratio(name: str) -> float:
        return statistics.median(ours / torch for ours, torch in zip(times[name], times["torch"]))

    print(f"import torch       {statistics.median(times['torch']) * 1000:8.1f} ms CPU")
    print(
        f"import drivetrain  {statistics.median(times['ours']) * 1000:8.1f} ms CPU   ratio {ratio('ours'):.3f}x torch"
    )
    print(
        f"from drivetrain import Accelerator {statistics.median(times['full']) * 1000:8.1f} ms CPU"
        f"   ratio {ratio('full'):.3f}x torch"
    )
    on_top = cost_on_top_of_torch(sys.executable, "from drivetrain import Accelerator", args.repeats)
    print(
        f"import torch; from drivetrain import Accelerator, in one process: {on_top:.3f}x import torch alone"
    )
    if args.compare_core:
        this_core = os.path.dirname(os.path.dirname(os.path.abspath(drivetrain_file())))
        trees = {"this tree": this_core, args.compare_core: os.path.abspath(args.compare_core)}
        ratios: dict[str, list[float]] = {name: [] for name in trees}
        for round_index in range(args.repeats + 1):
            for name, core in trees.items():
                ratio_here = on_top_ratio(sys.executable, "from drivetrain import Accelerator", core)
                if round_index:  # the first round writes the other tree's bytecode cache
                    ratios[name].append(ratio_here)
        for name, values in ratios.items():
            print(f"  in one process, rounds interleaved, {name}: {statistics.median(values):.3f}x")
    if args.reference_python:
        reference_on_top = cost_on_top_of_torch(args.reference_python, "import accelerate", args.repeats)
        print(f"import torch; import accelerate, in one process: {reference_on_top:.3f}x import torch alone")
        reference = median_time(args.reference_python, "import accelerate", args.repeats)
        reference_torch = median_time(args.reference_python, "import torch", args.repeats)
        print(
            f"import accelerate  {reference * 1000:8.1f} ms CPU   ratio {reference / reference_torch:.3f}x torch"
        )


if __name__ == "__main__":
    main()
