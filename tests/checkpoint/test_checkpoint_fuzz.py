"""Fuzzing the checkpoint reader (issue 23, point 7): random truncations, bit flips, manifest field
mutations, symbolic links and huge sizes. Every case must end in a successful load or a
:class:`CheckpointError` (never another exception, a crash or a hang), and a failed load must leave the
model untouched; memory must not grow with what a manifest claims.

CI runs ``DRIVETRAIN_FUZZ_CASES`` cases (default 300, a few seconds). More, with another seed:

    DRIVETRAIN_FUZZ_CASES=20000 DRIVETRAIN_FUZZ_SEED=7 python -m pytest tests/checkpoint/test_checkpoint_fuzz.py -q

A failing case prints its number and mutation; rerun it alone with ``DRIVETRAIN_FUZZ_ONLY=<number>``.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil

import pytest
import torch

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.errors import CheckpointError
from drivetrain.utils import ProjectConfiguration, set_seed

CASES = int(os.environ.get("DRIVETRAIN_FUZZ_CASES", "300"))
SEED = int(os.environ.get("DRIVETRAIN_FUZZ_SEED", "0"))
ONLY = os.environ.get("DRIVETRAIN_FUZZ_ONLY")

#: What a tampered manifest field is set to.
ODD_VALUES = [
    -1,
    0,
    1,
    255,
    2**31,
    2**63,
    10**30,
    True,
    None,
    "",
    "x" * 100,
    1.5,
    float("inf"),
    [],
    {},
    [0] * 50,
]


def _files(folder: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(root, name), folder)
        for root, _, names in os.walk(folder)
        for name in names
        if name != manifests.MANIFEST_NAME
    )


def _reseal(folder: str) -> None:
    """The attacker's move: a manifest recomputed over the tampered files, so the readers see them."""
    os.remove(os.path.join(folder, manifests.MANIFEST_NAME))
    manifests.write_manifest(folder, {"step": 1})


def _mutate(folder: str, rng: random.Random) -> str:
    """Apply one random mutation to a copy of a checkpoint; returns what was done."""
    files = _files(folder)
    victim = rng.choice(files)
    path = os.path.join(folder, victim)
    manifest_path = os.path.join(folder, manifests.MANIFEST_NAME)
    kind = rng.choice(["truncate", "flip", "field", "symlink", "huge", "delete", "manifest_bytes", "extra"])
    reseal = rng.random() < 0.5
    if kind == "truncate":
        size = os.path.getsize(path)
        with open(path, "r+b") as handle:
            handle.truncate(rng.randrange(size + 1) if size else 0)
    elif kind == "flip":
        data = bytearray(open(path, "rb").read())
        for _ in range(rng.randint(1, 8)):
            if data:
                index = rng.randrange(len(data))
                data[index] ^= 1 << rng.randrange(8)
        open(path, "wb").write(bytes(data))
    elif kind == "symlink":
        os.remove(path)
        os.symlink(rng.choice(["/proc/self/environ", "/etc/hostname", "/dev/zero", "../x"]), path)
        reseal = False  # a save refuses to seal a link; the manifest stays as it was
    elif kind == "delete":
        os.remove(path)
    elif kind == "extra":
        open(
            os.path.join(folder, rng.choice(["model_1.safetensors", "optimizer_1.bin", "x.bin"])), "wb"
        ).write(os.urandom(rng.randrange(64)))
    else:
        reseal = False
        with open(manifest_path) as handle:
            manifest = json.load(handle)
        if kind == "huge":
            manifest["files"][victim]["size"] = rng.choice([2**40, 2**62, 2**64, 10**20])
            if rng.random() < 0.5:
                manifest["chunk_size"] = rng.choice([256, 1024])
        elif kind == "field":
            where = rng.choice(
                ["chunk_size", "version", "format", "files", "size", "chunks", "name", "metadata"]
            )
            value = rng.choice(ODD_VALUES)
            if where in ("chunk_size", "version", "format", "files", "metadata"):
                manifest[where] = value
            elif where == "size":
                manifest["files"][victim]["size"] = value
            elif where == "chunks":
                manifest["files"][victim][rng.choice(["xxh3_128_chunks", "sha256_chunks"])] = value
            else:
                manifest["files"][rng.choice(["../x", "/etc/passwd", "", "a/../../b"])] = manifest["files"][
                    victim
                ]
        else:  # manifest_bytes
            raw = json.dumps(manifest).encode()
            cut = rng.randrange(len(raw))
            raw = raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1 :]
            open(manifest_path, "wb").write(raw)
            return f"manifest byte {cut} replaced"
        open(manifest_path, "w").write(json.dumps(manifest))
        return f"{kind} on {victim}"
    if reseal:
        _reseal(folder)
    return f"{kind} on {victim}{' (resealed)' if reseal else ''}"


def _training_objects(project_dir: str):
    set_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=project_dir))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    return accelerator, *accelerator.prepare(model, optimizer, scheduler)


def test_fuzzed_checkpoints_load_or_fail_clearly(tmp_path):
    accelerator, model, optimizer, scheduler = _training_objects(str(tmp_path))
    accelerator.backward(model(torch.randn(4, 8)).sum())
    optimizer.step()
    pristine = {
        safe: accelerator.save_state(tmp_path / f"pristine_{safe}", safe_serialization=safe)
        for safe in (True, False)
    }
    accelerator.backward(model(torch.randn(4, 8)).sum())
    optimizer.step()  # the live model now differs from every checkpoint
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    memory_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rng = random.Random(SEED)
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(CASES):
        case_rng = random.Random(rng.random())
        if ONLY is not None and case != int(ONLY):
            continue
        folder = str(tmp_path / "case")
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(pristine[case_rng.random() < 0.5], folder, symlinks=True)
        what = _mutate(folder, case_rng)
        try:
            accelerator.load_state(folder)
        except CheckpointError:
            outcomes["refused"] += 1
            changed = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
            assert not changed, f"case {case} ({what}): a failed load changed {changed}"
        except Exception as exc:
            pytest.fail(f"case {case} ({what}): {type(exc).__name__}: {exc}")
        else:
            outcomes["loaded"] += 1  # a resealed flip inside tensor data is a valid checkpoint
            model.load_state_dict(before)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - memory_before) / 1024
    assert grown_mb < 256, f"peak memory grew by {grown_mb:.0f} MB over {CASES} cases"
    assert outcomes["refused"] > 0 and (ONLY is not None or outcomes["loaded"] + outcomes["refused"] == CASES)


# -- DCP metadata (issue 29, finding 4) -------------------------------------------------------------------------
#: What a field of DCP metadata is set to.
ODD_DCP_VALUES = [
    -1,
    0,
    2**40,
    2**63,
    None,
    "",
    "../x",
    "/etc/passwd",
    "a/../../b",
    "__0_0.distcp/../__0_0.distcp",
    "\x00",
    [],
    {},
    1.5,
    [2**40],
    [-1, 4],
]


def _dcp_pristine(folder: str) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    state = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5, dtype=torch.float16), "lr": 0.5}
    dcp.save(state, checkpoint_id=folder, no_dist=True)


def _mutate_dcp(folder: str, rng: random.Random) -> str:
    """One random mutation of a DCP folder's ``.metadata`` (or, less often, of its data file)."""
    import pickle

    from drivetrain.checkpoint.dcp_reading import read_dcp_metadata

    path = os.path.join(folder, ".metadata")
    kind = rng.choice(["flip", "truncate", "field", "field", "field", "data"])
    if kind in ("flip", "truncate") or kind == "data":
        victim = path if kind != "data" else os.path.join(folder, "__0_0.distcp")
        data = bytearray(open(victim, "rb").read())
        if kind == "truncate":
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        open(victim, "wb").write(bytes(data))
        return f"{kind} of {os.path.basename(victim)}"
    metadata = read_dcp_metadata(folder)
    value = rng.choice(ODD_DCP_VALUES)
    tensors = [k for k, v in metadata.state_dict_metadata.items() if hasattr(v, "chunks")]
    fqn = rng.choice(tensors)
    item = metadata.state_dict_metadata[fqn]
    where = rng.choice(
        ["path", "offset", "length", "size", "chunk_sizes", "chunk_offsets", "items", "storage"]
    )
    if where in ("path", "offset", "length"):
        info = rng.choice(list(metadata.storage_data.values()))
        setattr(info, {"path": "relative_path"}.get(where, where), value)
    elif where == "size":
        item.size = torch.Size(value) if isinstance(value, list) and all(v >= 0 for v in value) else value
    elif where in ("chunk_sizes", "chunk_offsets"):
        chunk = rng.choice(item.chunks)
        setattr(chunk, where.split("_")[1], value)
    elif where == "items":
        metadata.state_dict_metadata = value if rng.random() < 0.5 else {fqn: value}
    else:
        metadata.storage_data = value if rng.random() < 0.5 else {next(iter(metadata.storage_data)): value}
    with open(path, "wb") as out:
        pickle.dump(metadata, out)
    return f"{where} of {fqn} set to {value!r}"


def _fuzz(tmp_path, pristine: str, mutate, attempt, seed: int) -> dict[str, int]:
    """``attempt(folder)`` on mutated copies of the folder ``pristine``: each must succeed or raise one
    CheckpointError (anything else fails the test, naming the case and its mutation)."""
    rng = random.Random(seed)
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(max(CASES // 3, 20)):
        case_rng = random.Random(rng.random())
        if ONLY is not None and case != int(ONLY):
            continue
        folder = str(tmp_path / "case")
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(pristine, folder)
        what = mutate(folder, case_rng)
        try:
            attempt(folder)
        except CheckpointError:
            outcomes["refused"] += 1
        except Exception as exc:
            pytest.fail(f"case {case} ({what}): {type(exc).__name__}: {exc}")
        else:
            outcomes["loaded"] += 1
    return outcomes


def test_fuzzed_dcp_metadata_reads_or_fails_clearly(tmp_path):
    """Random damage to a DCP folder: reading its metadata, allocating the tensors it declares (as
    ``merge-weights`` does) and loading them ends in success or one CheckpointError, never another
    exception, and memory does not grow with the sizes the metadata declares."""
    from drivetrain.checkpoint.dcp_reading import read_dcp_metadata, safe_dcp_load

    def attempt(folder: str) -> None:
        metadata = read_dcp_metadata(folder)
        state = {
            key: torch.empty(item.size, dtype=item.properties.dtype)
            for key, item in metadata.state_dict_metadata.items()
            if hasattr(item, "chunks")
        }
        state["lr"] = 0.0
        safe_dcp_load(state, folder, no_dist=True)

    pristine = str(tmp_path / "pristine")
    _dcp_pristine(pristine)
    memory_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes = _fuzz(tmp_path, pristine, _mutate_dcp, attempt, SEED + 1)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - memory_before) / 1024
    assert grown_mb < 256, f"peak memory grew by {grown_mb:.0f} MB"
    assert outcomes["refused"] > 0


# -- weights index files (issue 29, findings 3 and 4) -----------------------------------------------------------
def _mutate_index(folder: str, rng: random.Random) -> str:
    index_path = os.path.join(folder, "model.safetensors.index.json")
    kind = rng.choice(["bytes", "map_value", "map_value", "nest", "shard", "top"])
    if kind == "bytes":
        raw = bytearray(open(index_path, "rb").read())
        cut = rng.randrange(len(raw))
        raw[cut] = rng.randrange(256)
        open(index_path, "wb").write(bytes(raw[: rng.choice([len(raw), cut + 1])]))
        return f"index byte {cut} replaced"
    if kind == "nest":
        depth = rng.choice([65, 1000, 100_000])
        open(index_path, "w").write('{"weight_map": ' + "[" * depth + "]" * depth + "}")
        return f"index nested {depth} deep"
    if kind == "shard":
        shard = rng.choice(sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")))
        path = os.path.join(folder, shard)
        data = bytearray(open(path, "rb").read())
        data = data[: rng.randrange(len(data))] if rng.random() < 0.5 else data
        if data:
            data[rng.randrange(min(len(data), 64))] ^= 0xFF
        open(path, "wb").write(bytes(data))
        return f"shard {shard} damaged"
    index = json.load(open(index_path))
    value = rng.choice(ODD_DCP_VALUES + ["model-00001-of-00002.safetensors", "missing.safetensors"])
    if kind == "top":
        index = value
    else:
        index["weight_map"][rng.choice(sorted(index["weight_map"]))] = value
    open(index_path, "w").write(json.dumps(index))
    return f"{kind} set to {value!r}"


def test_fuzzed_index_files_load_or_fail_clearly(tmp_path):
    from drivetrain.big_modeling import load_checkpoint_in_model
    from drivetrain.checkpoint.model_files import write_model_files

    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    pristine = str(tmp_path / "pristine")
    assert len(write_model_files(model.state_dict(), pristine, max_shard_size=300)) > 1
    outcomes = _fuzz(
        tmp_path,
        pristine,
        _mutate_index,
        lambda folder: load_checkpoint_in_model(model, os.path.join(folder, "model.safetensors.index.json")),
        SEED + 2,
    )
    assert outcomes["refused"] > 0
