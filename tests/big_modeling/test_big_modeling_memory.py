"""Host memory while loading a big checkpoint: the bounds of the big-model issue, measured, not timed.

Each load runs in a fresh interpreter that reports how much its resident set grew: the peak (``VmHWM``,
reset through ``/proc/self/clear_refs`` just before the load when the kernel allows it) minus the resident
set just before the load. The checkpoint is 256 MiB of fp32 Linear layers in 8 safetensors shards, large
enough that the allowance below is small beside the quantities bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

WIDTH = 2048
LAYERS = 16
SHARDS = 8
MiB = 2**20
#: What a load may hold beyond the weights it keeps: the copy reader's bounce buffers (16 MiB per thread,
#: only for casts and accelerators), thread stacks, Python objects and allocator slack. Measured growth is
#: within a few MiB of the weights kept; 32 MiB leaves room for allocator noise without hiding a second
#: copy of a 32 MiB shard.
ALLOWANCE = 32 * MiB

CHILD = r"""
import json, sys, torch
from drivetrain.big_modeling import init_empty_weights, load_checkpoint_and_dispatch

def status(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

folder, offload, width, layers, device_map, map_weights, forwards = json.loads(sys.argv[1])
torch.set_num_threads(1)
with init_empty_weights():
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
try:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets VmHWM to the current resident set
except OSError:
    pass
before = status("VmRSS")
model = load_checkpoint_and_dispatch(
    model, folder, device_map=device_map, offload_folder=offload, map_weights=map_weights
)
peak = status("VmHWM")
with torch.no_grad():
    first = float(model[0].weight.double().sum()) if model[0].weight.device.type != "meta" else None
    for _ in range(forwards):
        model(torch.ones(2, width))
print(json.dumps({"growth": peak - before, "first_sum": first, "forward_growth": status("VmHWM") - before}))
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[str, float]:
    folder = tmp_path_factory.mktemp("big_checkpoint")
    generator = torch.Generator().manual_seed(0)
    weight_map = {}
    per = LAYERS // SHARDS
    first_sum = 0.0
    for shard in range(SHARDS):
        tensors = {}
        for layer in range(shard * per, (shard + 1) * per):
            tensors[f"{layer}.weight"] = torch.randn(WIDTH, WIDTH, generator=generator)
            tensors[f"{layer}.bias"] = torch.zeros(WIDTH)
            if layer == 0:
                first_sum = float(tensors["0.weight"].double().sum())
        name = f"model-{shard:05d}.safetensors"
        save_file(tensors, folder / name)
        weight_map.update({key: name for key in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return str(folder), first_sum


def _load(
    folder: str, device_map: dict, map_weights: bool = True, offload: str | None = None, forwards: int = 0
) -> dict:
    args = json.dumps([folder, offload, WIDTH, LAYERS, device_map, map_weights, forwards])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _shard_bytes(folder: str) -> list[int]:
    return [
        os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors")
    ]


@pytest.mark.parametrize("map_weights", [True, False], ids=["mapped", "copied"])
def test_cpu_load_grows_memory_by_at_most_1_2x_the_checkpoint(checkpoint, map_weights) -> None:
    folder, first_sum = checkpoint
    size = sum(_shard_bytes(folder))
    result = _load(folder, {"": "cpu"}, map_weights=map_weights)
    assert result["first_sum"] == first_sum
    assert result["growth"] < 1.2 * size, (result["growth"] / MiB, size / MiB)
    # The weights themselves are resident after the load (every byte is read during it).
    assert result["growth"] > 0.9 * size, (result["growth"] / MiB, size / MiB)


def test_disk_offload_load_stays_under_largest_shard_plus_cpu_weights(checkpoint, tmp_path) -> None:
    pytest.importorskip("drivetrain_offload")
    folder, first_sum = checkpoint
    cpu_layers = 2
    device_map = {str(i): "cpu" if i < cpu_layers else "disk" for i in range(LAYERS)}
    cpu_bytes = cpu_layers * (WIDTH * WIDTH + WIDTH) * 4
    bound = max(_shard_bytes(folder)) + cpu_bytes + ALLOWANCE
    assert bound < 0.5 * sum(_shard_bytes(folder))  # the bound would catch reading the whole checkpoint
    result = _load(folder, device_map, offload=str(tmp_path / "offload"), forwards=2)
    assert result["first_sum"] == first_sum
    assert result["growth"] < bound, (result["growth"] / MiB, bound / MiB)
    # Running it holds the running block, the prefetched next one and the matmul's workspace (the BLAS
    # packs a weight matrix, about one more block): a disk weight's mapped pages leave the process when
    # its module is done with it, they do not pile up into a mapped copy of the checkpoint.
    block = (WIDTH * WIDTH + WIDTH) * 4
    running = cpu_bytes + 3 * block + ALLOWANCE
    assert running < 0.5 * sum(_shard_bytes(folder))
    assert result["forward_growth"] < running, (result["forward_growth"] / MiB, running / MiB)
    # The offload folder only indexes the checkpoint's own safetensors: nothing was copied there.
    assert os.listdir(tmp_path / "offload") == ["index.json"]
