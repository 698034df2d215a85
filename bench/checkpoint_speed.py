"""How fast save_state / load_state are, and how much memory they take, against the same bytes written raw.

    python bench/checkpoint_speed.py [--size-mb 512] [--repeats 2] [--reference-python /tmp/ref-venv/bin/python]

Each system runs in its own process: a model of ``--size-mb`` fp32 weights (square Linear layers) with AdamW
state (two more copies), saved and loaded back from a scratch folder. Systems:

- ``drivetrain``: Accelerator.save_state(blocking=False) / load_state, the opt-in asynchronous save
  (safetensors weights; fsync, checksums, manifest and rename finished in the background after save_state
  returns; verified on load). ``finish s`` is how long
  ``wait_for_checkpoint()`` then waits until the checkpoint is complete on disk (timed separately, after
  the save: the training loop would run meanwhile);
- ``drivetrain-blocking``: the same with ``save_state(blocking=True)``, the default: returns once complete on
  disk;
- ``drivetrain-blocking-sha256`` (only when named in ``--systems``): the same with
  ``ProjectConfiguration(checkpoint_sha256=True)``, the opt-in that also records sha256 checksums;
- ``raw``: safetensors.torch.save_file(weights) + torch.save(optimizer state), load_file + torch.load (no
  fsync, no checksum);
- ``raw+fsync``: the same plus an fsync of each file (what durability costs anyway);
- ``accelerate``: the reference system's save_state / load_state, run by ``--reference-python`` (an
  interpreter whose environment has accelerate; never install it into drivetrain's own venv);
- ``accelerate+fsync``: the same plus an fsync of every file it wrote: the like-for-like reference for the
  default (blocking) save_state, whose target is <= 1.1x of it;
- any system with ``-over`` appended (``drivetrain-blocking-over``, ``accelerate+fsync-over``, ...; only
  when named in ``--systems``): every timed save goes over the checkpoint the previous one left in the same
  folder (an untimed save first), the ``save_state("checkpoints/last")`` loop; the others save into a new
  folder each time. Target (issue 29): ``drivetrain-blocking-over`` no slower than ``drivetrain-blocking``.
  As the new-folder variant deletes the previous checkpoint untimed before each save, the ``-over``
  variant waits (untimed) for drivetrain's background deletion of the files the previous save replaced (a
  training loop runs meanwhile); releases without it delete them inside save_state, Accelerate not at all.

Memory is the peak resident set of the process's own pages (file pages mapped from the page cache
excluded) sampled every 2 ms during the operation (for a save: until it is complete), minus the same
before it
(model, gradients freed, optimizer state already allocated). Target: the extra during a save stays below one
largest tensor. Times are wall seconds, best of ``--repeats``; before each timed save the page cache's dirty
pages are written out (``os.sync``, untimed) so no system pays for another's writeback. Loads read files
the save just wrote (warm page cache) in every system.

The summary prints drivetrain's time over each other system's: the targets are <= 1.0 against accelerate
and <= 1.2 against raw. Neither raw nor accelerate ever makes its files durable; drivetrain does it after
save_state returns (``finish s``), and drivetrain-blocking inside it, for which raw+fsync is the
like-for-like floor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

LAYER = 4096  # one Linear(4096, 4096) weight is 64 MiB in fp32: the largest tensor


def _rss() -> int:
    """Resident memory of the process's own (statm's resident minus file-backed pages): pages of a file
    mapped from the page cache (drivetrain maps the optimizer file while loading it) are the cache's, not
    the process's, and are dropped with the mapping."""
    with open("/proc/self/statm") as handle:
        fields = handle.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Samples the resident set in a thread while the block runs."""

    def __enter__(self) -> PeakMemory:
        self.base = _rss()
        self.peak = self.base
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while self._running:
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._running = False
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def _build(size_mb: int):
    import torch

    torch.manual_seed(0)
    layers = max(1, round(size_mb * 2**20 / (LAYER * LAYER * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(LAYER, LAYER, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def _fsync_tree(directory: str) -> None:
    for folder, _, names in os.walk(directory):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def _wait_for_background_deletion() -> None:
    try:
        from drivetrain.checkpoint.publishing import wait_for_discards
    except ImportError:  # a release that deletes the replaced files inside save_state
        return
    wait_for_discards()


def _child(name: str, size_mb: int, directory: str, repeats: int) -> dict:
    import torch

    over = name.endswith("-over")  # save over the previous checkpoint in the same folder
    system = name.removesuffix("-over")
    torch.set_num_threads(1)
    model, optimizer = _build(size_mb)
    nbytes = sum(p.numel() * 4 for p in model.parameters()) * 3
    finish = None
    if system.startswith("drivetrain"):
        from drivetrain import Accelerator
        from drivetrain.utils import ProjectConfiguration

        project = ProjectConfiguration(checkpoint_sha256=system.endswith("-sha256"))
        accelerator = Accelerator(cpu=True, project_config=project)
        model, optimizer = accelerator.prepare(model, optimizer)
        blocking = system.startswith("drivetrain-blocking")
        save = lambda: accelerator.save_state(directory, blocking=blocking)  # noqa: E731
        finish = accelerator.wait_for_checkpoint
        load = lambda: accelerator.load_state(directory)  # noqa: E731
    elif system.startswith("accelerate"):
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)

        def save() -> None:
            accelerator.save_state(directory)
            if system == "accelerate+fsync":
                _fsync_tree(directory)

        load = lambda: accelerator.load_state(directory)  # noqa: E731
    else:
        from safetensors.torch import load_file, save_file

        def save() -> None:
            os.makedirs(directory, exist_ok=True)
            save_file(
                model.state_dict(), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"}
            )
            torch.save(optimizer.state_dict(), os.path.join(directory, "optimizer.bin"))
            if system == "raw+fsync":
                _fsync_tree(directory)

        def load() -> None:
            model.load_state_dict(load_file(os.path.join(directory, "model.safetensors")))
            optimizer.load_state_dict(torch.load(os.path.join(directory, "optimizer.bin"), weights_only=True))

    result = {
        "system": name,
        "checkpoint_mb": nbytes / 2**20,
        "save_s": [],
        "finish_s": [],
        "load_s": [],
        "save_extra_mb": 0.0,
        "load_extra_mb": 0.0,
    }
    shutil.rmtree(directory, ignore_errors=True)
    if over:
        save()
        if finish is not None:
            finish()
    for _ in range(repeats):
        if not over:
            shutil.rmtree(directory, ignore_errors=True)
        elif system.startswith("drivetrain"):
            _wait_for_background_deletion()
        os.sync()
        with PeakMemory() as memory:
            start = time.perf_counter()
            save()
            result["save_s"].append(time.perf_counter() - start)
            if finish is not None:
                start = time.perf_counter()
                finish()
                result["finish_s"].append(time.perf_counter() - start)
        result["save_extra_mb"] = max(result["save_extra_mb"], memory.extra_mb)
        with PeakMemory() as memory:
            start = time.perf_counter()
            load()
            result["load_s"].append(time.perf_counter() - start)
        result["load_extra_mb"] = max(result["load_extra_mb"], memory.extra_mb)
    shutil.rmtree(directory, ignore_errors=True)
    result["largest_tensor_mb"] = LAYER * LAYER * 4 / 2**20
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=512, help="model weights in MiB (fp32)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--reference-python",
        default="/tmp/ref-venv/bin/python",
        help="interpreter with accelerate installed (skipped when missing)",
    )
    parser.add_argument(
        "--systems", default="drivetrain,drivetrain-blocking,raw,raw+fsync,accelerate,accelerate+fsync"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.size_mb, args.dir, args.repeats)))
        return

    rows = []
    scratch = tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        for system in args.systems.split(","):
            python = args.reference_python if system.startswith("accelerate") else sys.executable
            if not os.path.exists(python):
                print(f"skipping {system}: {python} not found", file=sys.stderr)
                continue
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            if system.startswith("accelerate"):
                env.pop("PYTHONPATH", None)
            completed = subprocess.run(
                [
                    python,
                    os.path.abspath(__file__),
                    "--child",
                    system,
                    "--dir",
                    os.path.join(scratch, system),
                    "--size-mb",
                    str(args.size_mb),
                    "--repeats",
                    str(args.repeats),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            if completed.returncode != 0:
                print(f"{system} failed:\n{completed.stderr[-3000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(completed.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"checkpoint: {rows[0]['checkpoint_mb']:.0f} MiB (weights + AdamW state); "
        f"largest tensor {rows[0]['largest_tensor_mb']:.0f} MiB"
        if rows
        else "no results"
    )
    print(f"{'system':<20} {'save s':>8} {'finish s':>9} {'load s':>8} {'save +MiB':>10} {'load +MiB':>10}")
    for row in rows:
        finish = f"{min(row['finish_s']):>9.2f}" if row["finish_s"] else f"{'-':>9}"
        print(
            f"{row['system']:<20} {min(row['save_s']):>8.2f} {finish} {min(row['load_s']):>8.2f} "
            f"{row['save_extra_mb']:>10.0f} {row['load_extra_mb']:>10.0f}"
        )
    by_name = {row["system"]: row for row in rows}
    blocking, reference = by_name.get("drivetrain-blocking"), by_name.get("accelerate+fsync")
    over = by_name.get("drivetrain-blocking-over")
    if blocking is not None and over is not None:
        print(
            f"save_state over an existing checkpoint / into a new folder (blocking): "
            f"{min(over['save_s']) / min(blocking['save_s']):.2f}x (target <= 1.0x)"
        )
    if blocking is not None and reference is not None:
        print(
            f"save_state (blocking, the default) / accelerate's save_state + fsync of its files: "
            f"{min(blocking['save_s']) / min(reference['save_s']):.2f}x (target <= 1.1x)"
        )
    ours = by_name.get("drivetrain")
    if ours is not None:
        print("drivetrain / other (best of each):")
        for name, row in by_name.items():
            if name == "drivetrain":
                continue
            print(
                f"  vs {name:<19} save {min(ours['save_s']) / min(row['save_s']):.2f}x   "
                f"load {min(ours['load_s']) / min(row['load_s']):.2f}x"
            )
        checkpoint = ours["checkpoint_mb"]
        budget = checkpoint + ours["largest_tensor_mb"]
        print(
            f"peak memory during save: model + optimizer {checkpoint:.0f} MiB + {ours['save_extra_mb']:.0f} MiB "
            f"(target: at most + one largest tensor, {ours['largest_tensor_mb']:.0f} MiB, = {budget:.0f} MiB); "
            f"during load: + {ours['load_extra_mb']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
