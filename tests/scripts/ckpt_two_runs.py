"""Two runs saving automatic checkpoints into one project_dir (issue 29, finding 5).

    python ckpt_two_runs.py pair PROJECT_DIR SAVES        start two runs together, each trying SAVES saves;
                                                         print the outcome as one JSON object
    python ckpt_two_runs.py run PROJECT_DIR RUN SAVES [--start-at FILE]
                                                         one run (after FILE exists, with --start-at);
                                                         prints one JSON line per save attempt

Every file of a save carries its run and save number, so a checkpoint mixing two runs' files shows: the
weights and the optimizer's momentum are all ``RUN * 1000 + save``, the registered object is
``{"run": RUN, "save": save}``. ``pair`` reports ``mixed`` (complete checkpoints whose files disagree) and
``lost`` (checkpoints whose save_state returned that are no longer complete, or hold another save). The
target of issue 29 is 0 of each for ``pair PROJECT_DIR 20``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch


class Identity:
    def __init__(self, run: int) -> None:
        self.run, self.save = run, -1

    def state_dict(self):
        return {"run": self.run, "save": self.save}

    def load_state_dict(self, state):
        self.run, self.save = state["run"], state["save"]


def run(project_dir: str, run_number: int, saves: int, start_at: str | None) -> None:
    from drivetrain import Accelerator
    from drivetrain.utils import ProjectConfiguration

    torch.set_num_threads(1)
    config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=config)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    identity = Identity(run_number)
    accelerator.register_for_checkpointing(identity)
    if start_at:
        # Started by `pair`: say this run is ready, then wait for the start, so that both runs save at once
        # however slowly each one starts (a busy machine can take seconds to import torch).
        open(f"{start_at}.ready{run_number}", "w").close()
        _wait_for(start_at)
    for save in range(saves):
        mark = float(run_number * 1000 + save)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(mark)
                optimizer.state[parameter]["momentum_buffer"] = torch.full_like(parameter, mark)
        identity.save = save
        try:
            location, error = accelerator.save_state(), None
        except Exception as exc:  # reported, and the next save is tried
            location, error = None, f"{type(exc).__name__}: {exc}"
        print(json.dumps({"run": run_number, "save": save, "location": location, "error": error}), flush=True)
    if start_at:
        # Stay alive (holding whatever this run holds) until the other run has tried every save too: a run
        # that ended before the other began would make them one after the other, not two at once.
        open(f"{start_at}.done{run_number}", "w").close()
        _wait_for(f"{start_at}.done{3 - run_number}")


def _wait_for(path: str, seconds: float = 900.0) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds:.0f} s")
        time.sleep(0.01)


def identity_of(folder: str) -> tuple[int, int] | None:
    """(run, save) that every file of a checkpoint agrees on, or None when they disagree (a mix)."""
    from safetensors.torch import load_file

    from drivetrain.checkpoint.serialization import safe_load

    weights = load_file(os.path.join(folder, "model.safetensors"))
    optimizer = safe_load(os.path.join(folder, "optimizer.bin"))
    registered = safe_load(os.path.join(folder, "custom_checkpoint_0.pkl"))
    marks = {float(tensor.flatten()[0]) for tensor in weights.values()}
    marks |= {float(state["momentum_buffer"].flatten()[0]) for state in optimizer["state"].values()}
    marks.add(float(registered["run"] * 1000 + registered["save"]))
    uniform = all(bool((tensor == tensor.flatten()[0]).all()) for tensor in weights.values())
    return (registered["run"], registered["save"]) if len(marks) == 1 and uniform else None


def pair(project_dir: str, saves: int) -> dict:
    from drivetrain.checkpoint import manifest as manifests
    from drivetrain.checkpoint import rotation

    start = os.path.join(
        os.path.dirname(os.path.abspath(project_dir)), f".{os.path.basename(project_dir)}.go"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, __file__, "run", project_dir, str(number), str(saves), "--start-at", start],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for number in (1, 2)
    ]
    ready = [f"{start}.ready{number}" for number in (1, 2)]
    deadline = time.monotonic() + 900
    while not all(os.path.exists(path) for path in ready) and time.monotonic() < deadline:
        if any(process.poll() is not None for process in runs):
            break  # a run ended before it was ready: its stderr says why
        time.sleep(0.01)
    open(start, "w").close()
    outputs = [process.communicate(timeout=1800) for process in runs]
    for path in [start, *ready, f"{start}.done1", f"{start}.done2"]:
        if os.path.exists(path):
            os.remove(path)
    results = [json.loads(line) for out, _ in outputs for line in out.splitlines() if line.startswith("{")]
    root = os.path.join(project_dir, "checkpoints")
    complete = rotation.complete_checkpoints(root)
    return {
        "exit_codes": [process.returncode for process in runs],
        "stderr": [err[-2000:] for _, err in outputs if err.strip()],
        "pids": {str(number): process.pid for number, process in zip((1, 2), runs)},
        "saved": {str(n): sum(1 for r in results if r["run"] == n and r["location"]) for n in (1, 2)},
        "errors": {str(n): [r["error"] for r in results if r["run"] == n and r["error"]] for n in (1, 2)},
        "complete": len(complete),
        "mixed": [path for path in complete if identity_of(path) is None],
        "lost": [
            r["location"]
            for r in results
            if r["location"]
            and not (
                manifests.is_complete(r["location"]) and identity_of(r["location"]) == (r["run"], r["save"])
            )
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run")
    one.add_argument("project_dir")
    one.add_argument("run", type=int)
    one.add_argument("saves", type=int)
    one.add_argument("--start-at")
    both = commands.add_parser("pair")
    both.add_argument("project_dir")
    both.add_argument("saves", type=int)
    args = parser.parse_args()
    if args.command == "run":
        run(args.project_dir, args.run, args.saves, args.start_at)
    else:
        print(json.dumps(pair(args.project_dir, args.saves), indent=1))


if __name__ == "__main__":
    main()
