"""Launch overhead: time from `drivetrain launch --num_processes 2 noop.py` to both processes running,
against `torchrun` on the same script (both go through torch's elastic launcher).

    python bench/launch_overhead.py [--repeats 5]

Each process writes the wall-clock time at which it started running the script; the figure is the time from
starting the launcher command to the later of the two. Reports the median of the repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOOP = """import os, sys, time
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(time.time()))
"""


def measure(command: list[str], folder: Path) -> float:
    for old in folder.glob("[0-9]"):
        old.unlink()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(folder)}
    start = time.time()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return max(float((folder / rank).read_text()) for rank in ("0", "1")) - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        script = folder / "noop.py"
        script.write_text(NOOP)
        commands = {
            "torchrun": [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                str(script),
                tmp,
            ],
            "drivetrain launch": [
                sys.executable,
                "-m",
                "drivetrain.launch",
                "--cpu",
                "--num_processes",
                "2",
                "--quiet",
                str(script),
                tmp,
            ],
        }
        results: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeats):  # interleaved, so background load affects both alike
            for name, command in commands.items():
                results[name].append(measure(command, folder))
    medians = {name: statistics.median(times) for name, times in results.items()}
    for name, value in medians.items():
        print(f"{name:18s} median {value:.3f} s  (runs: {', '.join(f'{t:.2f}' for t in results[name])})")
    print(
        f"ratio drivetrain/torchrun: {medians['drivetrain launch'] / medians['torchrun']:.3f} (target <= 1.10)"
    )


if __name__ == "__main__":
    main()
