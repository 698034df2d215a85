"""Sharded checkpoints from someone else run no code: DCP's ``.metadata`` and values are read safely by
``load_state`` and ``drivetrain merge-weights`` (issue 23, finding 1)."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drivetrain.commands.main import main as drivetrain_main
from drivetrain.testing import assert_checks_passed, launch_script

SCRIPTS = Path(__file__).parent / "scripts"


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _sharded_folder(path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    folder = path / "pytorch_model_fsdp_0"
    dcp.save({"model": {"weight": torch.arange(6.0).reshape(2, 3)}}, checkpoint_id=str(folder), no_dist=True)
    return folder


def test_merge_weights_refuses_metadata_that_runs_code(tmp_path, capsys):
    folder = _sharded_folder(tmp_path / "ckpt")
    assert drivetrain_main(["merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "merged")]) == 0
    assert torch.equal(
        load_file(str(tmp_path / "merged" / "model.safetensors"))["weight"], torch.arange(6.0).reshape(2, 3)
    )

    marker = tmp_path / "code_ran"
    with open(folder / ".metadata", "wb") as out:
        pickle.dump(_RunsCode(str(marker)), out)
    capsys.readouterr()
    assert drivetrain_main(["merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "merged2")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and ".metadata was refused (it names posix.system" in error, error
    assert not marker.exists() and not (tmp_path / "merged2").exists()


def _rewrite_metadata(folder: Path, change) -> None:
    from drivetrain.plugin_api.checkpoint import read_dcp_metadata

    metadata = read_dcp_metadata(folder)
    change(metadata)
    with open(folder / ".metadata", "wb") as out:
        pickle.dump(metadata, out)


@pytest.mark.parametrize("outside", ["../secret/__0_0.distcp", "ABSOLUTE"])
def test_merge_weights_refuses_metadata_pointing_outside_the_folder(tmp_path, capsys, outside):
    """The storage table of a DCP ``.metadata`` names the file each tensor is in: pointed outside the
    folder (at another genuine checkpoint's shard), merge-weights exits 1 with one line and writes nothing."""
    folder = _sharded_folder(tmp_path / "ckpt")
    secret = _sharded_folder(tmp_path / "secret_ckpt")
    os.rename(secret, tmp_path / "ckpt" / "secret")
    target = str(tmp_path / "ckpt" / "secret" / "__0_0.distcp") if outside == "ABSOLUTE" else outside

    def point_outside(metadata):
        for info in metadata.storage_data.values():
            info.relative_path = target

    _rewrite_metadata(folder, point_outside)
    capsys.readouterr()
    assert drivetrain_main(["merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "merged")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "outside the checkpoint folder: refused" in error, error
    assert not (tmp_path / "merged").exists()


def test_merge_weights_refuses_a_declared_size_the_files_do_not_hold(tmp_path, capsys):
    """A tensor declared with 2**40 elements: one line and exit 1 before anything is allocated (it used to
    try to allocate 4 TB and print a traceback)."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    folder = _sharded_folder(tmp_path / "ckpt")

    def huge(metadata):
        item = metadata.state_dict_metadata["model.weight"]
        item.size = torch.Size([2**40])
        item.chunks = [ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([2**40]))]
        for index in list(metadata.storage_data):
            if index.fqn == "model.weight":
                metadata.storage_data[type(index)("model.weight", torch.Size([0]))] = (
                    metadata.storage_data.pop(index)
                )

    _rewrite_metadata(folder, huge)
    capsys.readouterr()
    assert drivetrain_main(["merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "merged")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "declares 4398046511104 bytes for a chunk of 'model.weight'" in error, (
        error
    )
    assert not (tmp_path / "merged").exists()


@pytest.mark.multiprocess
def test_load_state_refuses_sharded_metadata_that_runs_code(tmp_path):
    env = {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = launch_script(
        str(SCRIPTS / "fsdp_untrusted.py"), num_processes=1, args=[str(tmp_path / "ckpt")], env=env
    )
    assert_checks_passed(
        result,
        [
            "sharded_metadata_refused",
            "sharded_metadata_ran_nothing",
            "sharded_model_untouched",
            "outside_path_refused",
            "outside_model_untouched",
        ],
    )
