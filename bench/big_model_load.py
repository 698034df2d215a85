"""Load time, peak RSS and disk-offloaded forward time: drivetrain against Accelerate, safetensors and `cat`.

    python bench/big_model_load.py --size-gb 2 [--ref-python /tmp/ref-venv/bin/python] [--repeat 3]

Builds a sharded safetensors checkpoint of stacked Linear layers (fp32), then measures, each run in a fresh
process, under two page-cache conditions:

* ``cold``: the checkpoint's pages are evicted first (``os.sync`` then ``posix_fadvise(DONTNEED)`` on each
  file; no root ``drop_caches`` needed) and the eviction is *verified* (``fincore``, or ``mincore`` when
  fincore is absent): 0 resident bytes, else the run is refused.
* ``warm``: the files are read once first and verified fully resident.

Each condition is timed against ``cat files > /dev/null`` under the same condition, the physical limit of
getting the bytes. Loads onto the CPU: drivetrain (weights mapped copy-on-write, pages faulted in during
the load), ``drivetrain-copy`` (``map_weights=False``: every byte read into the tensor's own memory),
``safetensors`` (``load_file`` per shard, ``load_state_dict(assign=True)``) and Accelerate. They report
``load`` (the call itself) and ``load+touch`` (the call plus one pass reading every parameter byte, a
sum): Accelerate and ``safetensors.torch.load_file`` return tensors backed by memory-mapped file pages
and read them from disk only when first touched, drivetrain reads every byte during the call, so only
``load+touch`` compares equal work. Peak RSS is the loading process's ``VmHWM`` (not ``ru_maxrss``,
which a child inherits from the parent that forked it); ``growth`` subtracts what the process held before
loading (interpreter, torch, empty model).

Forward: the model with every layer but the first offloaded to disk, cold (evicted before each forward;
the pages of layer 0, placed on the CPU, and of the block a prefetcher holds stay resident) and warm,
drivetrain as it comes (prefetching, the default when weights are on disk) and with ``prefetch=False``,
and Accelerate.

Figures are the median (and best) of ``--repeat`` runs, implementations interleaved. Runs take the lock
``/tmp/drivetrain-bench.lock`` when started through ``flock``; run on a quiet machine.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time

WIDTH = 4096


# ---------------------------------------------------------------------------------------------------------
# Page cache control, verified
# ---------------------------------------------------------------------------------------------------------


def resident_bytes(files: list[str]) -> int:
    """Bytes of ``files`` in the page cache (fincore when installed, else mincore)."""
    if shutil.which("fincore"):
        out = subprocess.run(
            ["fincore", "--bytes", "--raw", "--noheadings", "-o", "RES", *files],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return sum(int(line) for line in out.split())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    total = 0
    for path in files:
        size = os.path.getsize(path)
        if size == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if address in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
            vector = ctypes.create_string_buffer(-(-size // mmap.PAGESIZE))
            failed = libc.mincore(address, size, vector)
            libc.munmap(address, size)
            if failed:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            total += sum(byte & 1 for byte in vector.raw) * mmap.PAGESIZE
        finally:
            os.close(fd)
    return total


def evict(files: list[str], allowed: int = 0) -> None:
    """Drop ``files`` from the page cache and check that at most ``allowed`` bytes of them are left (pages
    the process itself maps, e.g. weights placed on the CPU, cannot be dropped)."""
    os.sync()
    for _ in range(5):
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        left = resident_bytes(files)
        if left <= allowed:
            return
        time.sleep(0.2)
    raise RuntimeError(f"could not evict the checkpoint from the page cache: {left} bytes still resident")


def warm(files: list[str]) -> None:
    """Read ``files`` into the page cache and check that all of them is there (another process's memory
    pressure may push pages out: a few tries, then the run is refused)."""
    total = sum(os.path.getsize(f) for f in files)
    for _ in range(3):
        for path in files:
            with open(path, "rb") as handle:
                while handle.read(1 << 24):
                    pass
        resident = resident_bytes(files)
        if resident >= total:
            return
    raise RuntimeError(f"the checkpoint does not stay in the page cache: {resident} of {total} bytes")


def prepare(condition: str, files: list[str], allowed: int = 0) -> None:
    if condition == "cold":
        evict(files, allowed)
    else:
        warm(files)


# ---------------------------------------------------------------------------------------------------------
# The checkpoint
# ---------------------------------------------------------------------------------------------------------


def build(folder: str, layers: int, shards: int) -> None:
    import torch
    from safetensors.torch import save_file

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as handle:
            if len(json.load(handle)["weight_map"]) == 2 * layers:
                return
        shutil.rmtree(folder)
    os.makedirs(folder, exist_ok=True)
    weight_map = {}
    per = -(-layers // shards)
    for shard in range(shards):
        tensors = {}
        for layer in range(shard * per, min(layers, (shard + 1) * per)):
            tensors[f"{layer}.weight"] = torch.randn(WIDTH, WIDTH) * 0.01
            tensors[f"{layer}.bias"] = torch.zeros(WIDTH)
        name = f"model-{shard:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
        weight_map.update({key: name for key in tensors})
    with open(index, "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)


def shard_files(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "*.safetensors")))


# ---------------------------------------------------------------------------------------------------------
# One measurement, in a fresh process
# ---------------------------------------------------------------------------------------------------------


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(impl: str, task: str, folder: str, layers: int, condition: str) -> None:
    import torch

    torch.set_num_threads(1)
    options: dict = {}
    if impl == "accelerate":
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    else:
        from drivetrain.big_modeling import init_empty_weights, load_checkpoint_and_dispatch

        # "drivetrain" keeps the default: prefetching is on when weights are on disk.
        options = {"prefetch": False} if impl == "drivetrain-no-prefetch" else {}
    with init_empty_weights():
        model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    files = shard_files(folder)
    result: dict = {}
    if task == "load":
        prepare(condition, files)
        before = _status_mib("VmRSS")
        start = time.perf_counter()
        if impl == "safetensors":
            from safetensors.torch import load_file

            for path in files:
                model.load_state_dict(load_file(path), strict=False, assign=True)
        elif impl == "drivetrain-copy":
            load_checkpoint_and_dispatch(model, folder, device_map={"": "cpu"}, map_weights=False)
        else:
            load_checkpoint_and_dispatch(model, folder, device_map={"": "cpu"})
        loaded = time.perf_counter()
        with torch.no_grad():
            for param in model.parameters():
                param.sum()
        result["load"] = loaded - start
        result["load_touch"] = time.perf_counter() - start
        result["peak_rss_mb"] = _status_mib("VmHWM")
        result["growth_mb"] = result["peak_rss_mb"] - before
    else:
        offload = folder + f"-offload-{impl}"
        shutil.rmtree(offload, ignore_errors=True)
        # Accelerate refuses a map that is only "disk": the first layer stays in RAM.
        device_map = {str(i): "cpu" if i == 0 else "disk" for i in range(layers)}
        model = load_checkpoint_and_dispatch(
            model, folder, device_map=device_map, offload_folder=offload, **options
        )
        x = torch.randn(8, WIDTH)
        times = []
        with torch.no_grad():
            if condition == "warm":
                model(x)  # first pass: opens the files
            # Layer 0 is placed on the CPU: its pages may stay mapped (hence resident) in this process, with
            # the page-cache folios (up to 2 MiB) they share with the next tensor.
            layer_bytes = (WIDTH * WIDTH + WIDTH) * 4 + 2 * 2 * 2**20
            if impl == "drivetrain":  # plus the one block the prefetcher holds in flight
                layer_bytes *= 2
            for _ in range(3):
                prepare(condition, files, allowed=layer_bytes)
                start = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - start)
        result["forward"] = min(times)
        result["peak_rss_mb"] = _status_mib("VmHWM")
    print(json.dumps(result))


def run(python: str, impl: str, task: str, folder: str, layers: int, condition: str) -> dict:
    output = subprocess.run(
        [python, __file__, "--child", impl, task, condition, "--folder", folder, "--layers", str(layers)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def time_cat(files: list[str], condition: str) -> float:
    prepare(condition, files)
    start = time.perf_counter()
    subprocess.run(["cat", *files], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (best {min(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--folder", default="/tmp/drivetrain-bench-ckpt")
    parser.add_argument("--ref-python", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--conditions", default="cold,warm")
    parser.add_argument("--tasks", default="load,forward", help="comma-separated: load, forward")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--child", nargs=3, default=None)
    args = parser.parse_args()
    layers = args.layers or max(1, round(args.size_gb * 2**30 / (WIDTH * WIDTH * 4)))
    if args.child:
        child(args.child[0], args.child[1], args.folder, layers, args.child[2])
        return
    build(args.folder, layers, args.shards)
    files = shard_files(args.folder)
    size_mb = sum(os.path.getsize(f) for f in files) / 2**20
    print(
        f"checkpoint: {size_mb:.0f} MiB in {len(files)} shards, {layers} x Linear({WIDTH},{WIDTH}) fp32; "
        f"median (best) of {args.repeat} runs; page cache state verified with "
        f"{'fincore' if shutil.which('fincore') else 'mincore'} before each run"
    )
    impls = [
        ("drivetrain", sys.executable),
        ("drivetrain-copy", sys.executable),
        ("safetensors", sys.executable),
    ]
    if args.ref_python:
        impls.append(("accelerate", args.ref_python))
    tasks = args.tasks.split(",")
    for condition in args.conditions.split(",") if "load" in tasks else []:
        cat: list[float] = []
        loads: dict[str, list[dict]] = {impl: [] for impl, _ in impls}
        for _ in range(args.repeat):
            cat.append(time_cat(files, condition))
            for impl, python in impls:
                loads[impl].append(run(python, impl, "load", args.folder, layers, condition))
        cat_s = statistics.median(cat)
        print(f"[{condition}] cat > /dev/null: {_summary(cat)}")
        for impl, results in loads.items():
            load = [r["load"] for r in results]
            touch = [r["load_touch"] for r in results]
            peak = max(r["peak_rss_mb"] for r in results)
            growth = max(r["growth_mb"] for r in results)
            print(
                f"[{condition}] {impl:15s} load {_summary(load)} = {statistics.median(load) / cat_s:.2f}x cat; "
                f"load+touch {_summary(touch)} = {statistics.median(touch) / cat_s:.2f}x cat; "
                f"peak RSS {peak:.0f} MiB, growth {growth:.0f} MiB = {growth / size_mb:.2f}x checkpoint"
            )
    if "forward" not in tasks:
        return
    forward_impls = [("drivetrain", sys.executable), ("drivetrain-no-prefetch", sys.executable)]
    if args.ref_python:
        forward_impls.append(("accelerate", args.ref_python))
    for condition in args.conditions.split(","):
        forwards: dict[str, list[dict]] = {impl: [] for impl, _ in forward_impls}
        for _ in range(args.repeat):
            for impl, python in forward_impls:
                forwards[impl].append(run(python, impl, "forward", args.folder, layers, condition))
        for impl, results in forwards.items():
            print(
                f"[{condition}] {impl:22s} disk-offloaded forward: "
                f"{_summary([r['forward'] for r in results])} (each run: best of 3 forwards), "
                f"peak RSS {max(r['peak_rss_mb'] for r in results):.0f} MiB"
            )


if __name__ == "__main__":
    main()
