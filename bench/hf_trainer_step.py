"""transformers' Trainer: time per optimizer step on drivetrain (through drivetrain-accelerate) against the same
Trainer on HuggingFace Accelerate.

    python bench/hf_trainer_step.py --reference-python PYTHON [--steps 60] [--repeats 3] [--processes 1,2]

PYTHON: a virtualenv with accelerate==1.15.0 and the same transformers and torch (``python -m venv ...;
pip install torch==2.13.0 accelerate==1.15.0 transformers==5.23.0 peft==0.21.2 trl==1.16.0 tokenizers``).
The model and data are contrib/accelerate/tests/hf_scenarios.py's (GPT-2 with n_layer=2, n_embd=32, a global
batch of 4 with gradient accumulation 2, AdamW, one thread per process): 1 process as launched by ``python``,
2 processes through each side's launcher (hf_runs.py: drivetrain's ``accelerate launch``, torchrun for the
reference). A step is measured inside the training process, from
one optimizer step's end to the next (loading the batches, two forward/backward passes, the optimizer step,
logging), as CPU time of process 0 (wall time on 2 shared cores is too noisy) and as wall time; the first 5
steps are left out (warm-up) and steps that saved a checkpoint too. Runs alternate between the two sides;
the ratio is drivetrain's median over Accelerate's. Target (issue 28): <= 1.0x.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

RUNS_MODULE = Path(__file__).resolve().parents[1] / "contrib" / "accelerate" / "tests" / "hf_runs.py"


def load_runs():
    spec = importlib.util.spec_from_file_location("hf_runs", RUNS_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(runs, name: str, python: str, reference: bool, steps: int, workdir: Path) -> tuple[list, list]:
    result = runs.launch(
        name,
        workdir,
        python,
        reference=reference,
        extra=("--max-steps", str(steps), "--save-steps", str(10 * steps)),
    )
    warm = 5
    return result["step_cpu_seconds"][warm:], result["step_wall_seconds"][warm:]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reference-python", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", default="1,2")
    args = parser.parse_args()
    runs = load_runs()
    for processes in [int(p) for p in args.processes.split(",")]:
        name = f"trainer-{processes}"
        samples: dict[str, tuple[list[float], list[float]]] = {"drivetrain": ([], []), "accelerate": ([], [])}
        with tempfile.TemporaryDirectory(prefix="hf-bench-") as folder:
            for repeat in range(args.repeats):
                order = ["drivetrain", "accelerate"] if repeat % 2 == 0 else ["accelerate", "drivetrain"]
                for side in order:
                    python = sys.executable if side == "drivetrain" else args.reference_python
                    cpu, wall = measure(
                        runs,
                        name,
                        python,
                        side == "accelerate",
                        args.steps,
                        Path(folder) / f"{side}-{repeat}",
                    )
                    samples[side][0].extend(cpu)
                    samples[side][1].extend(wall)
        ours, theirs = samples["drivetrain"], samples["accelerate"]
        cpu_ratio = statistics.median(ours[0]) / statistics.median(theirs[0])
        wall_ratio = statistics.median(ours[1]) / statistics.median(theirs[1])
        print(
            f"{processes} process(es): drivetrain {statistics.median(ours[0]) * 1000:.1f} ms CPU "
            f"({statistics.median(ours[1]) * 1000:.1f} ms wall) per step, accelerate "
            f"{statistics.median(theirs[0]) * 1000:.1f} ms CPU ({statistics.median(theirs[1]) * 1000:.1f} ms wall); "
            f"ratio {cpu_ratio:.3f}x CPU, {wall_ratio:.3f}x wall ({len(ours[0])} / {len(theirs[0])} steps)",
            flush=True,
        )


if __name__ == "__main__":
    main()
