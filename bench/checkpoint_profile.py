"""Where the seconds of a blocking save_state go, phase by phase, beside raw + fsync of the same bytes.

    python bench/checkpoint_profile.py [--size-mb 512] [--repeats 2] [--variants default,sha256,raw+fsync]

Builds the model of bench/checkpoint_speed.py (``--size-mb`` of fp32 weights with AdamW state) and times, in
one process, alternating: ``default`` (a blocking ``save_state``, xxh3-128 checksums), ``sha256``
(``ProjectConfiguration(checkpoint_sha256=True)``) and ``raw+fsync`` (``safetensors.save_file`` +
``torch.save`` + an fsync of each file). Each phase is timed by wrapping the function that does it (private
functions of drivetrain.checkpoint: this is a measuring tool, not an API); indented rows are parts of the
row above them. Process CPU beside wall time shows whether the save waits for the disk or for a core. Dirty
pages are written out (``os.sync``, untimed) before each save.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_speed import _build, _fsync_tree

PHASES: dict[str, float] = {}


def _add(name: str, seconds: float) -> None:
    PHASES[name] = PHASES.get(name, 0.0) + seconds


def _wrap(owner: Any, attribute: str, name: str) -> None:
    original = getattr(owner, attribute)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _add(name, time.perf_counter() - start)

    setattr(owner, attribute, timed)


def _instrument() -> None:
    from drivetrain.checkpoint import checkpointer, files, training_objects
    from drivetrain.checkpoint import manifest as manifests

    def write_all(self: Any, view: memoryview) -> None:
        # CheckpointFile._write_all, split into its waits: the write() syscalls, the hashing thread, the
        # writeback hand-off.
        hashed = None if self.hasher is None else files.hashing_pool().submit(self.hasher.update, view)
        start = time.perf_counter()
        self._handle.write(view)
        _add("  write() into the page cache", time.perf_counter() - start)
        if hashed is not None:
            start = time.perf_counter()
            hashed.result()
            _add("  then waiting for the checksum thread", time.perf_counter() - start)
        self._written += len(view)
        if (
            self._start_writeback is not None
            and self._written - self._handed_to_disk >= files._WRITEBACK_EVERY
        ):
            start = time.perf_counter()
            self._handle.flush()
            self._start_writeback(
                self._handle.fileno(), self._handed_to_disk, self._written - self._handed_to_disk
            )
            _add("  sync_file_range (early writeback)", time.perf_counter() - start)
            self._handed_to_disk = self._written

    files.CheckpointFile._write_all = write_all
    _wrap(training_objects, "save_safetensors", "model.safetensors")
    original_torch_save = training_objects.torch_save_into_checkpoint

    def torch_save(obj: Any, path: str) -> None:
        start = time.perf_counter()
        original_torch_save(obj, path)
        _add(os.path.basename(path), time.perf_counter() - start)

    training_objects.torch_save_into_checkpoint = torch_save
    _wrap(checkpointer, "write_kernel_objects", "kernel objects (RNG states, ...)")
    _wrap(manifests, "write_manifest", "fsyncs + manifest (write_manifest)")
    _wrap(manifests, "fsync_path", "  fsync of every file and folder")
    _wrap(manifests, "seal", "rename into place + parent fsync (seal)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default="default,sha256,raw+fsync")
    args = parser.parse_args()

    import torch
    from safetensors.torch import save_file

    from drivetrain import Accelerator

    torch.set_num_threads(1)
    _instrument()
    model, optimizer = _build(args.size_mb)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    scratch = tempfile.mkdtemp(prefix="ckpt-profile-", dir=os.environ.get("BENCH_DIR"))
    directory = os.path.join(scratch, "checkpoint")

    def raw_fsync() -> None:
        os.makedirs(directory, exist_ok=True)
        for name, write in (
            ("safetensors.save_file", lambda p: save_file(model.state_dict(), p, metadata={"format": "pt"})),
            ("torch.save", lambda p: torch.save(optimizer.state_dict(), p)),
        ):
            start = time.perf_counter()
            write(os.path.join(directory, "model.safetensors" if "safetensors" in name else "optimizer.bin"))
            _add(name, time.perf_counter() - start)
        start = time.perf_counter()
        _fsync_tree(directory)
        _add("fsync of each file", time.perf_counter() - start)

    try:
        for _ in range(args.repeats):
            for variant in args.variants.split(","):
                shutil.rmtree(directory, ignore_errors=True)
                os.sync()
                PHASES.clear()
                accelerator.project_configuration.checkpoint_sha256 = variant == "sha256"
                cpu, start = time.process_time(), time.perf_counter()
                raw_fsync() if variant == "raw+fsync" else accelerator.save_state(directory)
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                print(f"{variant}: {wall:.2f} s wall, {cpu:.2f} s process CPU, load {os.getloadavg()[0]:.2f}")
                for name, seconds in PHASES.items():
                    print(f"  {name:<44} {seconds:6.3f} s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
