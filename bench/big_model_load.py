"""Load time, peak RSS and disk-offloaded forward time: drivetrain against Accelerate and `cat`.

    python bench/big_model_load.py --size-gb 1 --folder /tmp/bigckpt [--ref-python /tmp/ref-venv/bin/python]

Builds a sharded safetensors checkpoint of stacked Linear layers (fp32), then, each in a fresh process
and with the files evicted from the page cache first (posix_fadvise DONTNEED, so every run reads from
disk): `cat files > /dev/null`, load_checkpoint_and_dispatch onto the CPU, and a forward of the model
with every layer but the first offloaded to disk — with drivetrain's prefetching of the next offloaded
layer and without it (``prefetch=False``), which measures what prefetching buys. Accelerate runs when
--ref-python names an interpreter that has it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import time

WIDTH = 4096


def evict(folder: str) -> None:
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def build(folder: str, layers: int, shards: int) -> None:
    import torch
    from safetensors.torch import save_file

    if os.path.isfile(os.path.join(folder, "model.safetensors.index.json")):
        return
    os.makedirs(folder, exist_ok=True)
    weight_map = {}
    per = -(-layers // shards)
    for shard in range(shards):
        tensors = {}
        for layer in range(shard * per, min(layers, (shard + 1) * per)):
            tensors[f"{layer}.weight"] = torch.randn(WIDTH, WIDTH) * 0.01
            tensors[f"{layer}.bias"] = torch.zeros(WIDTH)
        name = f"model-{shard:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, os.path.join(folder, name))
        weight_map.update({key: name for key in tensors})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)


def child(impl: str, task: str, folder: str, layers: int) -> None:
    import torch

    torch.set_num_threads(1)
    options: dict = {}
    if impl == "accelerate":
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    else:
        from drivetrain.big_modeling import init_empty_weights, load_checkpoint_and_dispatch

        options = {"prefetch": impl != "drivetrain-no-prefetch"}
    with init_empty_weights():
        model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    result: dict = {}
    if task == "load":
        start = time.perf_counter()
        load_checkpoint_and_dispatch(model, folder, device_map={"": "cpu"})
        result["seconds"] = time.perf_counter() - start
    else:
        offload = folder + f"-offload-{impl}"
        # Accelerate refuses a map that is only "disk": the first layer stays in RAM.
        device_map = {str(i): "cpu" if i == 0 else "disk" for i in range(layers)}
        model = load_checkpoint_and_dispatch(
            model, folder, device_map=device_map, offload_folder=offload, **options
        )
        x = torch.randn(8, WIDTH)
        times = []
        with torch.no_grad():
            for _ in range(3):
                evict(folder)
                start = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - start)
        result["seconds"] = min(times)
        result["first"] = times[0]
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def run(python: str, impl: str, task: str, folder: str, layers: int) -> dict:
    evict(folder)
    output = subprocess.run(
        [python, __file__, "--child", impl, task, "--folder", folder, "--layers", str(layers)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--folder", default="/tmp/drivetrain-bench-ckpt")
    parser.add_argument("--ref-python", default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--child", nargs=2, default=None)
    args = parser.parse_args()
    layers = args.layers or max(1, round(args.size_gb * 2**30 / (WIDTH * WIDTH * 4)))
    if args.child:
        child(args.child[0], args.child[1], args.folder, layers)
        return
    build(args.folder, layers, args.shards)
    files = sorted(glob.glob(os.path.join(args.folder, "*.safetensors")))
    size_mb = sum(os.path.getsize(f) for f in files) / 2**20
    evict(args.folder)
    start = time.perf_counter()
    subprocess.run(f"cat {' '.join(files)} > /dev/null", shell=True, check=True)
    cat_seconds = time.perf_counter() - start
    print(f"checkpoint: {size_mb:.0f} MiB in {len(files)} shards, {layers} x Linear({WIDTH},{WIDTH}) fp32")
    print(f"cat > /dev/null (cold cache): {cat_seconds:.2f} s")
    impls = [("drivetrain", sys.executable)] + ([("accelerate", args.ref_python)] if args.ref_python else [])
    for impl, python in impls:
        load = run(python, impl, "load", args.folder, layers)
        print(
            f"{impl:10s} load to CPU: {load['seconds']:.2f} s ({load['seconds'] / cat_seconds:.2f}x cat), "
            f"peak RSS {load['peak_rss_mb']:.0f} MiB ({load['peak_rss_mb'] / size_mb:.2f}x checkpoint)"
        )
    for impl, python in [*impls, ("drivetrain-no-prefetch", sys.executable)]:
        forward = run(python, impl, "forward", args.folder, layers)
        print(
            f"{impl:10s} disk-offloaded forward (cold cache): best {forward['seconds']:.2f} s, "
            f"first {forward['first']:.2f} s, peak RSS {forward['peak_rss_mb']:.0f} MiB"
        )
    resource.getrusage(resource.RUSAGE_CHILDREN)


if __name__ == "__main__":
    main()
