"""The Trainer runs that take several processes (hf_scenarios.py under a launcher), shared by the slow tests
(test_trainer_multiprocess.py) and the reference's run that records ``reference_runs.json``:

    python contrib/accelerate/tests/hf_runs.py --reference PYTHON     # PYTHON: a virtualenv with accelerate==1.15.0,
                                                                      # transformers==5.23.0, peft, trl, deepspeed

drivetrain's side launches through ``accelerate launch --cpu --num_processes N`` (drivetrain's launcher, as a
user of the stack would). The reference's through ``python -m torch.distributed.run --nproc_per_node N`` with
``ACCELERATE_USE_CPU=true``: Accelerate's own ``accelerate launch --cpu`` starts one process on a machine
without MPI (peer/README.md), which would not be a 2-process result.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "hf_scenarios.py"
REFERENCE_RESULTS = HERE / "reference_runs.json"

STEPS = ["--max-steps", "16", "--save-steps", "8"]
#: ZeRO stage -> DeepSpeed config; "auto" entries are filled from TrainingArguments, as users write them
DEEPSPEED = {
    stage: {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
    }
    for stage in (2, 3)
}
#: name -> (processes, scenario arguments); the global batch is 4 in every run (x2 accumulation)
RUNS: dict[str, tuple[int, list[str]]] = {
    "trainer-1": (1, ["trainer", *STEPS, "--batch", "4"]),
    "trainer-2": (2, ["trainer", *STEPS, "--batch", "2"]),
    "zero2-2": (2, ["trainer", *STEPS, "--batch", "2", "--deepspeed", "{zero2}"]),
    "zero3-2": (2, ["trainer", *STEPS, "--batch", "2", "--deepspeed", "{zero3}"]),
    "fsdp2-2": (2, ["trainer", *STEPS, "--batch", "2", "--fsdp"]),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_environment(**extra: str) -> dict[str, str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ACCELERATE_", "DRIVETRAIN_", "PYTHON", "RANK", "LOCAL_RANK", "WORLD_SIZE"))
    }
    environment.update(
        OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled",
        DS_ACCELERATOR="cpu", **extra,
    )  # fmt: skip
    return environment


def launch(
    name: str, workdir: Path, python: str | None = None, reference: bool = False, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run ``name`` (see RUNS) in ``workdir`` and return the result process 0 wrote. ``extra``: more scenario
    arguments (``--stop-at 8``, ``--resume DIR``)."""
    python = python or sys.executable
    processes, arguments = RUNS[name]
    workdir.mkdir(parents=True, exist_ok=True)
    for stage, config in DEEPSPEED.items():
        (workdir / f"zero{stage}.json").write_text(json.dumps(config))
    arguments = [a.format(zero2=workdir / "zero2.json", zero3=workdir / "zero3.json") for a in arguments]
    out = workdir / f"result{'-'.join(('', *extra)).replace('/', '_')[:60]}.json"
    script = [str(SCENARIOS), *arguments, "--out", str(out), "--workdir", str(workdir), *extra]
    environment = clean_environment(TMPDIR=str(workdir))
    if processes == 1:
        command = [python, *script]
    elif reference:
        environment["ACCELERATE_USE_CPU"] = "true"
        command = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--master_port", str(free_port()), *script]  # fmt: skip
    else:
        accelerate = str(Path(python).parent / "accelerate")
        command = [accelerate, "launch", "--cpu", "--num_processes", str(processes),
                   "--main_process_port", str(free_port()), *script]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=workdir, timeout=900)
    log = workdir / "log.txt"
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(
            f"{name} {' '.join(extra)} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
        )
    result = json.loads(out.read_text())
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def record_reference(python: str, workdir: Path) -> dict[str, Any]:
    """Every run of RUNS on the reference: losses per step and eval loss of the uninterrupted run."""
    versions = subprocess.run(
        [python, "-c", "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
         "('accelerate', 'transformers', 'torch', 'deepspeed', 'peft', 'trl')}))"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    runs: dict[str, Any] = {}
    for name in RUNS:
        try:
            result = launch(name, workdir / name, python, reference=True)
            runs[name] = {
                key: result[key] for key in ("losses", "eval_loss", "global_step", "distributed_type")
            }
        except RuntimeError as failure:
            runs[name] = {"failed": str(failure)[-1500:]}
        print(name, "failed" if "failed" in runs[name] else "ok", flush=True)
    return {"versions": json.loads(versions), "runs": runs, "recorded": time.strftime("%Y-%m-%d")}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reference", required=True, help="python of a virtualenv with the real Accelerate")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/hf-reference-runs"))
    options = parser.parse_args()
    recorded = record_reference(options.reference, options.workdir)
    REFERENCE_RESULTS.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"wrote {REFERENCE_RESULTS}")
