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


@pytest.mark.multiprocess
def test_load_state_refuses_sharded_metadata_that_runs_code(tmp_path):
    env = {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = launch_script(
        str(SCRIPTS / "fsdp_untrusted.py"), num_processes=1, args=[str(tmp_path / "ckpt")], env=env
    )
    assert_checks_passed(
        result, ["sharded_metadata_refused", "sharded_metadata_ran_nothing", "sharded_model_untouched"]
    )
