"""File-level checkpoint guarantees: our safetensors files are real safetensors, tied weights survive, the
manifest catches truncation and tampering, pruning keeps the newest, and a malicious pickle runs nothing."""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import pytest
import torch
import xxhash
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save_file as reference_save_file

from drivetrain.checkpoint import files, publishing, rotation
from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint.model_files import write_model_files
from drivetrain.checkpoint.serialization import (
    deduplicate_shared,
    load_safetensors_into_module,
    plan_shards,
    safe_load,
    save_safetensors,
)
from drivetrain.checkpoint.training_objects import torch_save_into_checkpoint
from drivetrain.constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from drivetrain.errors import CheckpointError
from drivetrain.units import parse_size


class TiedModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.hidden = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("counts", torch.arange(5, dtype=torch.int64))


def test_written_file_reads_back_with_safetensors_for_every_dtype(tmp_path):
    tensors = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(5).to(torch.bfloat16),
        "f16": torch.randn(2, 2).half(),
        "i64": torch.arange(7),
        "bool": torch.tensor([True, False, True]),
        "u8": torch.arange(9, dtype=torch.uint8),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "strided": torch.randn(4, 6).t(),  # non-contiguous
    }
    path = str(tmp_path / "x.safetensors")
    save_safetensors(tensors, path, metadata={"format": "pt"})
    loaded = load_file(path)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(path, framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}


def test_same_bytes_as_reference_writer_loads_identically(tmp_path):
    tensors = {"a": torch.randn(10, 3), "b": torch.arange(4, dtype=torch.int32)}
    ours, theirs = str(tmp_path / "ours.safetensors"), str(tmp_path / "theirs.safetensors")
    save_safetensors(tensors, ours)
    reference_save_file(tensors, theirs)
    assert all(torch.equal(load_file(ours)[k], load_file(theirs)[k]) for k in tensors)


def test_tied_weights_are_stored_once_and_fill_both_names_on_load(tmp_path):
    torch.manual_seed(0)
    source = TiedModel()
    tensors, aliases = deduplicate_shared(source.state_dict())
    assert aliases == {"head.weight": "embed.weight"}
    path = str(tmp_path / SAFE_WEIGHTS_NAME)
    save_safetensors(tensors, path, metadata={"format": "pt"})
    assert "head.weight" not in load_file(path)

    torch.manual_seed(1)
    target = TiedModel()
    load_safetensors_into_module(target, [path])
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
    assert target.head.weight is target.embed.weight


class HalfWithMasterCopy(torch.nn.Module):
    """Keeps its weight in bf16 and the full fp32 value aside; its state dict hands out the fp32 value and
    loading splits it again (what IPEX's bf16 training does): the state dict's tensors are copies."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4).to(torch.bfloat16))
        self.master = self.weight.detach().float()
        self._register_state_dict_hook(
            lambda module, state, prefix, local: state.update({prefix + "weight": module.master.clone()})
        )
        self._register_load_state_dict_pre_hook(self._split)

    def _split(self, state, prefix, *args) -> None:
        self.master = state[prefix + "weight"].clone()
        state[prefix + "weight"] = self.master.to(torch.bfloat16)


def test_a_module_whose_state_dict_hands_out_copies_is_loaded_through_load_state_dict(tmp_path):
    torch.manual_seed(0)
    source = HalfWithMasterCopy()
    source.master += 1e-4  # fp32 detail that bf16 cannot hold
    path = str(tmp_path / "m.safetensors")
    save_safetensors(source.state_dict(), path)
    target = HalfWithMasterCopy()
    load_safetensors_into_module(target, [path])
    assert torch.equal(target.state_dict()["weight"], source.state_dict()["weight"])
    assert torch.equal(target.weight, source.master.to(torch.bfloat16))
    save_safetensors({"weight": torch.zeros(2, 2)}, path)
    with pytest.raises(CheckpointError, match="cannot load .* into HalfWithMasterCopy: .*size mismatch"):
        load_safetensors_into_module(target, [path])


def test_loading_reports_missing_unexpected_and_mismatched_keys(tmp_path):
    path = str(tmp_path / "m.safetensors")
    save_safetensors({"hidden.weight": torch.zeros(3, 3), "extra": torch.zeros(1)}, path)
    with pytest.raises(CheckpointError) as error:
        load_safetensors_into_module(TiedModel(), [path])
    message = str(error.value)
    assert "hidden.weight: checkpoint (3, 3), model (6, 6)" in message
    assert "extra" in message and "embed.weight" in message and path in message


def test_non_tensor_values_are_refused_by_the_safe_writer():
    with pytest.raises(CheckpointError, match="'step' is a int"):
        deduplicate_shared({"w": torch.zeros(1), "step": 3})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5MB", 5 * 10**6),
        ("10GB", 10**10),
        ("2GiB", 2 * 2**30),
        ("100kb", 10**5),
        (1234, 1234),
        ("1.5MB", 1_500_000),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text, what="max_shard_size", allow_zero=False) == expected


@pytest.mark.parametrize("bad", ["5 parsecs", "", "-3MB", 0, True, "MB"])
def test_parse_size_rejects_with_the_valid_forms(bad):
    with pytest.raises(ValueError, match="max_shard_size=.*'10GB'"):
        parse_size(bad, what="max_shard_size", allow_zero=False)


def test_shard_plan_respects_limit_and_isolates_oversized_tensors():
    tensors = {"a": torch.zeros(10), "b": torch.zeros(10), "big": torch.zeros(100), "c": torch.zeros(5)}
    assert plan_shards(tensors, 80) == [["a", "b"], ["big"], ["c"]]
    assert plan_shards({}, 80) == [[]]


def test_save_model_files_single_and_sharded(tmp_path):
    torch.manual_seed(0)
    model = TiedModel()
    directory = str(tmp_path / "out")
    assert write_model_files(model.state_dict(), directory) == [SAFE_WEIGHTS_NAME]
    assert not os.path.exists(os.path.join(directory, SAFE_WEIGHTS_INDEX_NAME))

    names = write_model_files(model.state_dict(), directory, max_shard_size=200)
    assert len(names) > 1 and names[0] == f"model-00001-of-{len(names):05d}.safetensors"
    assert not os.path.exists(os.path.join(directory, SAFE_WEIGHTS_NAME)), "stale single file left behind"
    with open(os.path.join(directory, SAFE_WEIGHTS_INDEX_NAME)) as handle:
        index = json.load(handle)
    assert set(index["weight_map"].values()) == set(names)
    merged = {}
    for name in names:
        merged.update(load_file(os.path.join(directory, name)))
    assert set(merged) == set(index["weight_map"]) == set(model.state_dict()) - {"head.weight"}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in merged.values())
    for key, tensor in merged.items():
        assert torch.equal(tensor, model.state_dict()[key])

    # Fewer shards the next time: the old ones and the index disappear.
    write_model_files(model.state_dict(), directory)
    assert sorted(os.listdir(directory)) == [SAFE_WEIGHTS_NAME]


def test_save_model_files_bin_names(tmp_path):
    model = TiedModel()
    directory = str(tmp_path / "bin")
    names = write_model_files(model.state_dict(), directory, max_shard_size=200, safe_serialization=False)
    assert names[0].startswith("pytorch_model-00001-of-") and names[0].endswith(".bin")
    assert os.path.exists(os.path.join(directory, WEIGHTS_INDEX_NAME))
    assert write_model_files(model.state_dict(), directory, safe_serialization=False) == [WEIGHTS_NAME]
    loaded = torch.load(os.path.join(directory, WEIGHTS_NAME), weights_only=True)
    assert loaded["head.weight"].data_ptr() == loaded["embed.weight"].data_ptr()


# -- manifests --------------------------------------------------------------------------------------------------
def _make_checkpoint(root, name, payload=b"weights", checksums=files.DEFAULT_CHECKSUMS):
    final = os.path.join(root, name)
    temporary = publishing.start_staging(final)
    torch_save_into_checkpoint({"w": torch.arange(100)}, os.path.join(temporary, "optimizer.bin"))
    with open(os.path.join(temporary, "extra.txt"), "wb") as handle:  # a file another library wrote
        handle.write(payload)
    manifests.write_manifest(temporary, {"step": 1}, checksums)
    publishing.publish(temporary, final)
    return final


def test_manifest_lists_every_file_and_verifies(tmp_path):
    final = _make_checkpoint(str(tmp_path), "checkpoint_0")
    manifest = manifests.verify(final)
    assert set(manifest["files"]) == {"optimizer.bin", "extra.txt"}
    assert manifest["metadata"] == {"step": 1}
    assert not os.path.exists(manifests.incomplete_path(final))


def test_truncated_file_is_named(tmp_path):
    final = _make_checkpoint(str(tmp_path), "checkpoint_0")
    path = os.path.join(final, "optimizer.bin")
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) - 10)
    with pytest.raises(CheckpointError, match=r"optimizer\.bin has \d+ bytes but the manifest records"):
        manifests.verify(final)
    assert not manifests.is_complete(final)


@pytest.mark.parametrize("checksums", [files.DEFAULT_CHECKSUMS, files.SHA256_CHECKSUMS])
def test_tampered_file_of_same_size_is_named(tmp_path, checksums):
    final = _make_checkpoint(str(tmp_path), "checkpoint_0", checksums=checksums)
    with open(os.path.join(final, "extra.txt"), "wb") as handle:
        handle.write(b"WEIGHTS")
    assert manifests.is_complete(final)  # sizes match: only the checksums can tell
    with pytest.raises(CheckpointError, match=r"extra\.txt does not match its xxh3_128 checksum"):
        manifests.verify(final)
    if "sha256" in checksums:
        with pytest.raises(CheckpointError, match=r"extra\.txt does not match its sha256 checksum"):
            manifests.verify(final, checksum="sha256")
    else:  # saved without sha256 (the default): asking for it names the file and the opt-in
        with pytest.raises(CheckpointError, match=r"records no sha256 for '.*'.*checkpoint_sha256=True"):
            manifests.verify(final, checksum="sha256")


def test_folder_without_manifest_is_not_a_checkpoint(tmp_path):
    final = _make_checkpoint(str(tmp_path), "checkpoint_0")
    os.remove(os.path.join(final, manifests.MANIFEST_NAME))
    with pytest.raises(CheckpointError, match="no drivetrain_manifest.json.*verify_manifest=False"):
        manifests.verify(final)
    assert rotation.complete_checkpoints(str(tmp_path)) == []


def test_manifest_cannot_point_outside_the_folder(tmp_path):
    final = _make_checkpoint(str(tmp_path), "checkpoint_0")
    path = os.path.join(final, manifests.MANIFEST_NAME)
    with open(path) as handle:
        manifest = json.load(handle)
    manifest["files"]["../../etc/passwd"] = {"size": 1, "sha256": "0"}
    with open(path, "w") as handle:
        json.dump(manifest, handle)
    with pytest.raises(CheckpointError, match="outside the folder"):
        manifests.verify(final)


def test_latest_complete_skips_incomplete_and_numbers_sort_numerically(tmp_path):
    root = str(tmp_path)
    for number in (2, 10, 9):
        _make_checkpoint(root, f"checkpoint_{number}")
    os.makedirs(os.path.join(root, "checkpoint_11"))  # no manifest: never complete
    manifests.start_incomplete(os.path.join(root, "checkpoint_12"))  # a killed save
    assert [os.path.basename(p) for p in rotation.complete_checkpoints(root)] == [
        "checkpoint_2",
        "checkpoint_9",
        "checkpoint_10",
    ]


def test_prune_keeps_newest_and_limit_and_foreign_folders(tmp_path):
    root = str(tmp_path)
    for number in range(4):
        _make_checkpoint(root, f"checkpoint_{number}")
    os.makedirs(os.path.join(root, "checkpoint_7"))  # not ours, no manifest: left alone
    manifests.start_incomplete(os.path.join(root, "checkpoint_8"))  # leftover of a killed save: removed
    deleted = rotation.prune(root, 2, keep=os.path.join(root, "checkpoint_3"))
    assert sorted(os.path.basename(p) for p in deleted) == ["checkpoint_0", "checkpoint_1"]
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3", "checkpoint_7"]
    # total_limit=1 still keeps the checkpoint just written.
    rotation.prune(root, 1, keep=os.path.join(root, "checkpoint_3"))
    assert sorted(os.listdir(root)) == ["checkpoint_3", "checkpoint_7"]


def test_resaving_into_an_existing_folder_replaces_it_and_recovers_after_a_crash(tmp_path):
    root = str(tmp_path)
    final = _make_checkpoint(root, "run", payload=b"old")
    _make_checkpoint(root, "run", payload=b"new!")
    with open(os.path.join(final, "extra.txt"), "rb") as handle:
        assert handle.read() == b"new!"
    # A save that died between its two renames leaves only the moved-aside copy: recover() puts it back.
    os.rename(final, os.path.join(root, ".run.replaced"))
    publishing.recover(final)
    assert manifests.verify(final)


# -- safe unpickling ---------------------------------------------------------------------------------------------
class _WritesAFile:
    """Unpickling this calls ``open(path, 'w')`` — proof of code execution if the file appears."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malicious_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = str(tmp_path / "optimizer.bin")
    torch.save({"state": _WritesAFile(str(marker))}, path)
    with pytest.raises(
        CheckpointError,
        match=r"optimizer\.bin holds objects that safe loading refuses.*"
        r"weights_only': False",
    ):
        safe_load(path)
    assert not marker.exists()
    # A plain pickle (not a torch zip file) is refused as well.
    raw = str(tmp_path / "raw.pkl")
    with open(raw, "wb") as handle:
        pickle.dump(_WritesAFile(str(marker)), handle)
    with pytest.raises(CheckpointError, match=r"raw\.pkl holds objects"):
        safe_load(raw)
    assert not marker.exists()


def test_explicit_opt_out_loads_trusted_objects(tmp_path):
    path = str(tmp_path / "custom.pkl")
    torch.save({"when": complex(1, 2), "obj": _Trusted(3)}, path)
    with pytest.raises(CheckpointError):
        safe_load(path)
    assert safe_load(path, weights_only=False)["obj"].value == 3


class _Trusted:
    def __init__(self, value):
        self.value = value


def test_rng_states_load_safely():
    import io

    from drivetrain.operations.random import capture_rng_state

    buffer = io.BytesIO()
    torch.save(capture_rng_state(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert set(state) >= {"python", "numpy", "torch"}


# -- checksums in pieces, versions 1 and 2 ---------------------------------------------------------------------
@pytest.mark.parametrize("checksums", [files.DEFAULT_CHECKSUMS, files.SHA256_CHECKSUMS])
def test_the_manifest_records_the_checksums_asked_for_of_every_piece_of_every_file(
    tmp_path, monkeypatch, checksums
):
    monkeypatch.setattr(files, "HASH_CHUNK_SIZE", 1000)
    monkeypatch.setattr(files, "_WRITEBACK_EVERY", 700)  # writes split across pieces and writeback calls
    folder = manifests.start_incomplete(str(tmp_path / "checkpoint_0"))
    tensors = {"a": torch.randn(1000), "b": torch.arange(3, dtype=torch.int64), "c": torch.randn(0)}
    save_safetensors(tensors, os.path.join(folder, "w.safetensors"))
    torch_save_into_checkpoint({"big": torch.randn(2000), "small": 3}, os.path.join(folder, "o.bin"))
    with open(os.path.join(folder, "empty.bin"), "wb"):
        pass
    manifests.write_manifest(folder, {}, checksums)
    manifest = manifests.read_manifest(folder)
    assert manifest["version"] == 3
    recorded = manifest["files"]
    assert set(recorded) == {"w.safetensors", "o.bin", "empty.bin"}
    for name, record in recorded.items():
        with open(os.path.join(folder, name), "rb") as handle:
            data = handle.read()
        pieces = [data[start : start + 1000] for start in range(0, len(data), 1000)] or [b""]
        expected = {
            "size": len(data),
            "xxh3_128_chunks": [xxhash.xxh3_128(piece).hexdigest() for piece in pieces],
        }
        if "sha256" in checksums:
            expected["sha256_chunks"] = [hashlib.sha256(piece).hexdigest() for piece in pieces]
        assert record == expected
    assert len(recorded["o.bin"]["xxh3_128_chunks"]) > 3
    if "sha256" in checksums:
        assert files.sha256_chunks_of_file(os.path.join(folder, "o.bin"), 1000) == (
            recorded["o.bin"]["size"],
            recorded["o.bin"]["sha256_chunks"],
        )


def test_a_changed_byte_in_any_piece_is_found_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "HASH_CHUNK_SIZE", 256)
    final = _make_checkpoint(str(tmp_path), "checkpoint_0", checksums=files.SHA256_CHECKSUMS)
    manifest = manifests.verify(final)
    assert manifest["version"] == 3 and manifest["chunk_size"] == 256
    assert len(manifest["files"]["optimizer.bin"]["sha256_chunks"]) > 2
    path = os.path.join(final, "optimizer.bin")
    with open(path, "r+b") as handle:
        handle.seek(600)  # inside the third piece
        byte = handle.read(1)
        handle.seek(600)
        handle.write(bytes([byte[0] ^ 1]))
    with pytest.raises(CheckpointError, match=r"optimizer\.bin does not match its xxh3_128 checksum"):
        manifests.verify(final)
    with pytest.raises(CheckpointError, match=r"optimizer\.bin does not match its sha256 checksum"):
        manifests.verify(final, checksum="sha256")


def test_version_1_manifests_still_verify_and_catch_tampering(tmp_path):
    final = _make_checkpoint(str(tmp_path), "checkpoint_0")
    _rewrite_as_version_1(final)
    manifest = manifests.verify(final)
    assert manifest["version"] == 1 and "sha256" in manifest["files"]["optimizer.bin"]
    assert rotation.complete_checkpoints(str(tmp_path)) == [final]
    with open(os.path.join(final, "extra.txt"), "wb") as handle:
        handle.write(b"WEIGHTS")
    with pytest.raises(CheckpointError, match=r"extra\.txt does not match its sha256 checksum"):
        manifests.verify(final)


@pytest.mark.parametrize("recorded", [("sha256",), ("sha256", "xxh3_128")])
def test_version_2_manifests_still_verify_and_catch_tampering(tmp_path, monkeypatch, recorded):
    """What drivetrain wrote before manifest version 3: sha256 of every piece always, xxh3-128 in its later
    releases."""
    monkeypatch.setattr(files, "HASH_CHUNK_SIZE", 256)
    final = _make_checkpoint(str(tmp_path), "checkpoint_0", checksums=files.SHA256_CHECKSUMS)
    path = os.path.join(final, manifests.MANIFEST_NAME)
    with open(path) as handle:
        manifest = json.load(handle)
    manifest["version"] = 2
    for entry in manifest["files"].values():
        for algorithm in files.CHECKSUMS:
            if algorithm not in recorded:
                del entry[f"{algorithm}_chunks"]
    with open(path, "w") as handle:
        json.dump(manifest, handle)
    assert manifests.verify(final)["version"] == 2
    assert manifests.verify(final, checksum="sha256")["version"] == 2
    assert rotation.complete_checkpoints(str(tmp_path)) == [final]
    with open(os.path.join(final, "optimizer.bin"), "r+b") as handle:
        handle.seek(300)
        byte = handle.read(1)
        handle.seek(300)
        handle.write(bytes([byte[0] ^ 1]))
    checked = "xxh3_128" if "xxh3_128" in recorded else "sha256"
    with pytest.raises(CheckpointError, match=rf"optimizer\.bin does not match its {checked} checksum"):
        manifests.verify(final)
    with pytest.raises(CheckpointError, match=r"optimizer\.bin does not match its sha256 checksum"):
        manifests.verify(final, checksum="sha256")


def test_a_manifest_of_a_newer_version_is_refused_with_upgrade_advice(tmp_path):
    final = _make_checkpoint(str(tmp_path), "checkpoint_0")
    path = os.path.join(final, manifests.MANIFEST_NAME)
    with open(path) as handle:
        manifest = json.load(handle)
    manifest["version"] = manifests.MANIFEST_VERSION + 1
    with open(path, "w") as handle:
        json.dump(manifest, handle)
    with pytest.raises(
        CheckpointError, match=rf"manifest version {manifests.MANIFEST_VERSION + 1}.*upgrade drivetrain"
    ):
        manifests.verify(final)


def _rewrite_as_version_1(folder):
    """What drivetrain wrote before manifest version 2: one whole-file sha256 per file, no chunk_size."""
    path = os.path.join(folder, manifests.MANIFEST_NAME)
    with open(path) as handle:
        manifest = json.load(handle)
    manifest["version"] = 1
    del manifest["chunk_size"]
    for name in list(manifest["files"]):
        size, digest = files.sha256_of_file(os.path.join(folder, name))
        manifest["files"][name] = {"size": size, "sha256": digest}
    with open(path, "w") as handle:
        json.dump(manifest, handle)


def test_checkpoint_pickles_skip_the_zip_crc_and_still_load(tmp_path):
    # The manifest checksums every byte, so torch.save's per-record CRC-32 is skipped inside a checkpoint
    # (and only there: the setting is back afterwards for everyone else's torch.save).
    from torch.utils.serialization import config

    state = {"w": torch.randn(300), "step": 3}
    path = str(tmp_path / "optimizer.bin")
    torch_save_into_checkpoint(state, path)
    assert config.save.compute_crc32 is True
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3
    import zipfile

    assert {info.CRC for info in zipfile.ZipFile(path).infolist()} == {0}


def _save_both_ways(tmp_path, monkeypatch, sha256):
    """The same state saved by a blocking save (checksummed while written) and by an asynchronous one
    (checksummed by reading the files back), with pieces small enough that every file has several."""
    from drivetrain import Accelerator
    from drivetrain.utils import ProjectConfiguration

    monkeypatch.setattr(files, "HASH_CHUNK_SIZE", 1 << 20)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(700, 700), torch.nn.Linear(700, 3))
    optimizer = torch.optim.AdamW(model.parameters())
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(checkpoint_sha256=sha256))
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 700)).sum().backward()
    optimizer.step()
    read_back = []
    checksum_range = files.checksum_range
    monkeypatch.setattr(
        manifests, "checksum_range", lambda path, *a: read_back.append(path) or checksum_range(path, *a)
    )
    accelerator.save_state(str(tmp_path / "blocking"))
    blocking_read_back = list(read_back)
    accelerator.save_state(str(tmp_path / "async"), blocking=False)
    accelerator.wait_for_checkpoint()
    listed = [
        json.loads((tmp_path / name / manifests.MANIFEST_NAME).read_text())["files"]
        for name in ("blocking", "async")
    ]
    return accelerator, listed, blocking_read_back, read_back[len(blocking_read_back) :]


@pytest.mark.parametrize("sha256", [False, True])
def test_a_blocking_save_checksums_while_writing_and_records_what_reading_back_would(
    tmp_path, monkeypatch, sha256
):
    accelerator, (blocking, asynchronous), blocking_read_back, async_read_back = _save_both_ways(
        tmp_path, monkeypatch, sha256
    )
    # the blocking save read nothing back for the files it wrote itself; the asynchronous one read them all
    assert not any(path.endswith(("model.safetensors", "optimizer.bin")) for path in blocking_read_back)
    assert any(path.endswith("optimizer.bin") for path in async_read_back)
    assert len(blocking["optimizer.bin"]["xxh3_128_chunks"]) > 1
    for name in ("model.safetensors", "optimizer.bin"):
        assert blocking[name] == asynchronous[name]  # sizes and checksums of every piece
        assert ("sha256_chunks" in blocking[name]) == sha256  # sha256 only when asked for
    # and the checksums are those of the bytes on disk: a standard hash of each piece agrees
    data = (tmp_path / "blocking" / "optimizer.bin").read_bytes()
    pieces = [data[offset : offset + (1 << 20)] for offset in range(0, len(data), 1 << 20)]
    assert blocking["optimizer.bin"]["xxh3_128_chunks"] == [
        xxhash.xxh3_128(piece).hexdigest() for piece in pieces
    ]
    if sha256:
        assert blocking["optimizer.bin"]["sha256_chunks"] == [
            hashlib.sha256(piece).hexdigest() for piece in pieces
        ]
    accelerator.load_state(str(tmp_path / "blocking"))  # verified against the manifest
    if sha256:
        accelerator.load_state(str(tmp_path / "blocking"), verify_manifest="sha256")


def test_checksums_of_a_failed_save_are_not_taken_for_the_next_files(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint"
    temporary = manifests.start_incomplete(str(target))
    with files.blocking_save(True), files.checkpoint_writer(os.path.join(temporary, "weights.bin")) as out:
        out.write(b"a" * 100)
    # the save fails here; the next one writes a file of the same name and size some other way
    temporary = manifests.start_incomplete(str(target))
    with open(os.path.join(temporary, "weights.bin"), "wb") as handle:
        handle.write(b"b" * 100)
    manifests.write_manifest(temporary, {})
    listed = json.loads((tmp_path / f"{os.path.basename(temporary)}" / manifests.MANIFEST_NAME).read_text())
    assert listed["files"]["weights.bin"]["xxh3_128_chunks"] == [xxhash.xxh3_128(b"b" * 100).hexdigest()]
