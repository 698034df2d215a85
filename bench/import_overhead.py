"""Import cost: `import drivetrain` against `import torch`, in CPU time of a whole fresh process.

    python bench/import_overhead.py [--repeats 15] [--reference-python /tmp/ref-venv/bin/python]

Prints the median CPU time (user + system) of each and the median of the per-round ratios (the three
statements run in turn each round). With --reference-python, also times
`import accelerate` in that interpreter (a separate virtual environment with accelerate installed).
Target (issue 2): drivetrain <= 1.03x torch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys


def cpu_time(python: str, statement: str) -> float:
    """CPU seconds (user + system) that a fresh interpreter spends running ``statement``."""
    before = os.times()
    subprocess.run([python, "-c", statement], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def median_time(python: str, statement: str, repeats: int) -> float:
    cpu_time(python, statement)  # warm the file cache
    return statistics.median(cpu_time(python, statement) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--reference-python", default=None)
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
    if args.reference_python:
        reference = median_time(args.reference_python, "import accelerate", args.repeats)
        reference_torch = median_time(args.reference_python, "import torch", args.repeats)
        print(
            f"import accelerate  {reference * 1000:8.1f} ms CPU   ratio {reference / reference_torch:.3f}x torch"
        )


if __name__ == "__main__":
    main()
