"""Exact resume: a new process that loads a checkpoint ends with the same weights, bit for bit, as a run that
never stopped (CPU, one thread, dropout, a shuffling loader), at an epoch boundary and mid-epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from drivetrain.constants import SAFE_WEIGHTS_INDEX_NAME
from drivetrain.testing import launch_script

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "ckpt_resume.py")
EPOCHS = "3"
# One process: 12 batches per epoch; two processes: 6 each.
SINGLE = {"boundary": 12, "mid": 17}
DDP = {"boundary": 6, "mid": 9}


def _run(out, *args, env=None):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(out), **(env or {})}
    result = subprocess.run(
        [sys.executable, SCRIPT, args[0], str(out), EPOCHS, *args[1:]],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _assert_same_weights(out, resumed_name):
    expected = torch.load(os.path.join(out, "final_full.pt"), weights_only=True)
    resumed = torch.load(os.path.join(out, resumed_name), weights_only=True)
    assert expected.keys() == resumed.keys()
    different = [name for name in expected if not torch.equal(expected[name], resumed[name])]
    assert not different, f"weights differ after resuming: {different}"


def _assert_export_matches(out):
    """save_model on the (DDP-wrapped) model wrote shards with an index, unprefixed names, final weights."""
    with open(os.path.join(out, "export", SAFE_WEIGHTS_INDEX_NAME)) as handle:
        weight_map = json.load(handle)["weight_map"]
    exported = {}
    for shard in set(weight_map.values()):
        exported.update(load_file(os.path.join(out, "export", shard)))
    final = torch.load(os.path.join(out, "final_full.pt"), weights_only=True)
    assert exported.keys() == final.keys() == weight_map.keys()
    assert all(torch.equal(exported[name], final[name]) for name in final)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    """An uninterrupted run that saved at the boundary and mid-epoch on the way (saving must not disturb
    it), plus a run that saved mid-epoch and stopped."""
    out = tmp_path_factory.mktemp("single")
    _run(out, "full", f"{SINGLE['boundary']},{SINGLE['mid']}")
    _assert_export_matches(out)
    return out


@pytest.mark.parametrize("where", ["boundary", "mid"])
def test_single_process_resume_from_loader_state(single_run, where):
    _run(single_run, "second", str(SINGLE[where]), "state")
    _assert_same_weights(single_run, f"final_{SINGLE[where]}_state.pt")


def test_single_process_stop_then_resume_mid_epoch_with_skip_first_batches(tmp_path, single_run):
    # Train, save mid-epoch, stop; a new process resumes the way Accelerate scripts do (skip_first_batches).
    _run(tmp_path, "first", str(SINGLE["mid"]))
    assert not (tmp_path / "final_full.pt").exists()
    _run(tmp_path, "second", str(SINGLE["mid"]), "skip")
    os.link(single_run / "final_full.pt", tmp_path / "final_full.pt")
    _assert_same_weights(tmp_path, f"final_{SINGLE['mid']}_skip.pt")


@pytest.mark.multiprocess
def test_ddp_two_ranks_resume_at_boundary_and_mid_epoch(tmp_path):
    env = {"TMPDIR": str(tmp_path)}
    launch_script(SCRIPT, 2, args=["full", str(tmp_path), EPOCHS, f"{DDP['boundary']},{DDP['mid']}"], env=env)
    assert sorted(
        f for f in os.listdir(tmp_path / f"ckpt_{DDP['mid']}") if f.startswith("random_states")
    ) == ["random_states_0.pkl", "random_states_1.pkl"]
    _assert_export_matches(tmp_path)
    for where in ("boundary", "mid"):
        launch_script(SCRIPT, 2, args=["second", str(tmp_path), EPOCHS, str(DDP[where]), "state"], env=env)
        _assert_same_weights(tmp_path, f"final_{DDP[where]}_state.pt")


def test_single_process_mid_epoch_resume_when_the_loader_shuffles_from_the_global_rng(tmp_path):
    # Most scripts build DataLoader(shuffle=True) without a generator, and dropout draws from the same
    # global RNG: starting the resumed iterator must not consume an extra global draw.
    env = {"CKPT_GENERATOR": "global"}
    _run(tmp_path, "full", str(SINGLE["mid"]), env=env)
    _run(tmp_path, "second", str(SINGLE["mid"]), "state", env=env)
    _assert_same_weights(tmp_path, f"final_{SINGLE['mid']}_state.pt")
