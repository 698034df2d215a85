"""Reads stay inside the checkpoint, and parsers stay within bounds (issue 29, findings 3 and 4).

Every path read from checkpoint metadata (the manifest, a DCP ``.metadata``'s storage table, a
``model.safetensors.index.json`` weight map) resolves inside the checkpoint's folder or is refused; with a
manifest, only the files it lists are read. A manifest or index nested 100 000 deep, or DCP metadata that
declares more tensor bytes than its files hold, is one CheckpointError, never a RecursionError or a huge
allocation. The FSDP sides (``load_state`` of a sharded checkpoint in a real process, ``drivetrain
merge-weights``) are in plugins/fsdp/tests/test_untrusted_checkpoints.py."""

from __future__ import annotations

import json
import os
import pickle
import warnings

import pytest
import torch

from drivetrain import Accelerator
from drivetrain.big_modeling import load_checkpoint_in_model
from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint.dcp_reading import read_dcp_metadata, safe_dcp_load
from drivetrain.errors import CheckpointError
from drivetrain.utils import ProjectConfiguration, set_seed


def _setup(project_dir):
    set_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(project_dir)))
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model


def _reseal(folder):
    metadata = manifests.read_manifest(folder).get("metadata", {})
    os.remove(os.path.join(folder, manifests.MANIFEST_NAME))
    manifests.write_manifest(folder, metadata)


# -- a manifest's list is what a load reads ---------------------------------------------------------------------
def test_an_unlisted_model_safetensors_beside_a_listed_pytorch_model_bin_is_ignored(tmp_path):
    accelerator, model = _setup(tmp_path)
    with torch.no_grad():
        model.weight.fill_(1.0)
    folder = accelerator.save_state(tmp_path / "ckpt", safe_serialization=False)
    from safetensors.torch import save_file

    # Planted afterwards: by name it would be preferred (as Accelerate prefers it), but no manifest lists it.
    save_file(
        {"weight": torch.full((4, 4), 666.0), "bias": torch.zeros(4)},
        os.path.join(folder, "model.safetensors"),
    )
    with torch.no_grad():
        model.weight.fill_(0.0)
    accelerator.load_state(folder)
    assert bool((model.weight == 1.0).all()), "the unlisted model.safetensors was read"


def test_an_unlisted_data_loader_state_is_not_read(tmp_path):
    from torch.utils.data import DataLoader, TensorDataset

    set_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path)))
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(16.0)), batch_size=2))
    folder = accelerator.save_state(tmp_path / "ckpt")
    assert "dl_state_dict.bin" in manifests.read_manifest(folder)["files"]
    os.remove(os.path.join(folder, "dl_state_dict.bin"))
    _reseal(folder)  # a checkpoint without a loader position (it predates it): the loader starts afresh
    torch.save({"epoch": 5, "batches_yielded": 3}, os.path.join(folder, "dl_state_dict.bin"))  # planted
    accelerator.load_state(folder)
    assert loader.resume_state()["epoch"] == 0, "the unlisted dl_state_dict.bin was read"


# -- index files ----------------------------------------------------------------------------------------------
def _sharded(tmp_path):
    from drivetrain.checkpoint.model_files import write_model_files

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    folder = str(tmp_path / "weights")
    write_model_files(model.state_dict(), folder, max_shard_size=300)
    return model, folder, os.path.join(folder, "model.safetensors.index.json")


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors"])
def test_an_index_whose_weight_map_points_outside_its_folder_is_refused(tmp_path, target):
    from safetensors.torch import save_file

    model, folder, index_path = _sharded(tmp_path)
    save_file({"0.weight": torch.full((8, 8), 666.0)}, str(tmp_path / "outside.safetensors"))
    index = json.load(open(index_path))
    index["weight_map"]["0.weight"] = target
    json.dump(index, open(index_path, "w"))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"names shard\(s\) outside its folder"):
        load_checkpoint_in_model(model, index_path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_index_whose_shard_is_reached_through_a_link_is_refused(tmp_path):
    model, folder, index_path = _sharded(tmp_path)
    os.makedirs(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", os.path.join(folder, "linked"))
    index = json.load(open(index_path))
    shard = index["weight_map"]["0.weight"]
    os.rename(os.path.join(folder, shard), tmp_path / "elsewhere" / shard)
    index["weight_map"] = {
        name: f"linked/{shard}" if file == shard else file for name, file in index["weight_map"].items()
    }
    json.dump(index, open(index_path, "w"))
    with pytest.raises(CheckpointError, match=r"reached through a symbolic link"):
        load_checkpoint_in_model(model, index_path)


# -- bombs ----------------------------------------------------------------------------------------------------
def test_a_manifest_of_100000_nested_brackets_is_one_checkpoint_error(tmp_path):
    accelerator, model = _setup(tmp_path)
    folder = accelerator.save_state(tmp_path / "ckpt")
    with open(os.path.join(folder, manifests.MANIFEST_NAME), "w") as out:
        out.write("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match=r"nests lists or objects more than 64 deep"):
        accelerator.load_state(folder)
    with open(os.path.join(folder, manifests.MANIFEST_NAME), "w") as out:
        out.write('{"a":' * 70 + "1" + "}" * 70)  # within the parser's reach, beyond any manifest's shape
    with pytest.raises(CheckpointError, match=r"more than 64 deep"):
        manifests.read_manifest(folder)


def test_an_index_of_100000_nested_brackets_is_one_checkpoint_error(tmp_path):
    model, folder, index_path = _sharded(tmp_path)
    with open(index_path, "w") as out:
        out.write('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CheckpointError, match=r"more than 64 deep"):
        load_checkpoint_in_model(model, index_path)


# -- DCP metadata ---------------------------------------------------------------------------------------------
def _dcp_folder(tmp_path, name="dcp"):
    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    folder = str(tmp_path / name)
    dcp.save({"weight": torch.arange(12.0).reshape(3, 4), "lr": 0.5}, checkpoint_id=folder, no_dist=True)
    return folder


def _rewrite_metadata(folder, change):
    metadata = read_dcp_metadata(folder)
    change(metadata)
    with open(os.path.join(folder, ".metadata"), "wb") as out:
        pickle.dump(metadata, out)


@pytest.mark.parametrize("where", ["relative", "absolute", "nested"])
def test_dcp_metadata_pointing_outside_its_folder_is_refused(tmp_path, where):
    folder = _dcp_folder(tmp_path)
    outside = _dcp_folder(tmp_path, "outside")  # a genuine DCP file of the same layout, outside the folder
    target = {
        "relative": "../outside/__0_0.distcp",
        "absolute": os.path.join(outside, "__0_0.distcp"),
        "nested": "x/../../outside/__0_0.distcp",
    }[where]

    def point_outside(metadata):
        for index, info in metadata.storage_data.items():
            if index.fqn == "weight":
                info.relative_path = target

    _rewrite_metadata(folder, point_outside)
    with pytest.raises(CheckpointError, match=r"points 'weight' at .*outside the checkpoint folder: refused"):
        read_dcp_metadata(folder)
    state = {"weight": torch.zeros(3, 4), "lr": 0.0}
    with pytest.raises(CheckpointError, match=r"outside the checkpoint folder"):
        safe_dcp_load(state, folder, no_dist=True)
    assert torch.equal(state["weight"], torch.zeros(3, 4))


def test_dcp_metadata_declaring_more_bytes_than_its_files_hold_is_refused_before_allocating(tmp_path):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    folder = _dcp_folder(tmp_path)

    def huge(metadata):
        item = metadata.state_dict_metadata["weight"]
        item.size = torch.Size([2**40])
        item.chunks = [ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([2**40]))]

    _rewrite_metadata(folder, huge)
    with pytest.raises(
        CheckpointError, match=r"declares 4398046511104 bytes for a chunk of 'weight' but stores"
    ):
        read_dcp_metadata(folder)

    folder = _dcp_folder(tmp_path, "uncovered")

    def uncovered(metadata):  # the chunks stay as saved; only the declared size grows
        metadata.state_dict_metadata["weight"].size = torch.Size([3, 2**40])

    _rewrite_metadata(folder, uncovered)
    with pytest.raises(CheckpointError, match=r"outside its declared size|but its chunks hold 12"):
        read_dcp_metadata(folder)


def test_dcp_metadata_larger_than_the_limit_is_refused_unread(tmp_path, monkeypatch):
    from drivetrain.checkpoint import dcp_reading

    folder = _dcp_folder(tmp_path)
    monkeypatch.setattr(dcp_reading, "MAX_METADATA_BYTES", 64)
    with pytest.raises(CheckpointError, match=r"\.metadata is \d+ bytes, more than the 64"):
        read_dcp_metadata(folder)
