"""Two runs, one ``project_dir`` (issue 29, finding 5): one writer at a time, through a lock that a killed
run does not leave behind; no checkpoint mixing two runs' files is ever published, none that a run
completed is lost; ``load_state()`` takes the newest checkpoint that verifies and says which it skipped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from drivetrain import Accelerator
from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint import rotation
from drivetrain.errors import CheckpointError, CheckpointWarning
from drivetrain.utils import ProjectConfiguration

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "ckpt_two_runs.py")


def _run(project_dir, run, saves, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    return subprocess.Popen(
        [sys.executable, SCRIPT, "run", str(project_dir), str(run), str(saves)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_run_saving_into_the_same_project_dir_is_refused_naming_the_first(tmp_path):
    """Two runs started together, each saving 4 times with automatic naming into one project_dir: one
    saves 4 checkpoints, every save of the other is refused naming it; nothing mixed, nothing lost."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, SCRIPT, "pair", str(tmp_path / "project"), "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["exit_codes"] == [0, 0], outcome["stderr"]
    winner = "1" if outcome["saved"]["1"] else "2"
    loser = "2" if winner == "1" else "1"
    assert outcome["saved"] == {winner: 4, loser: 0}
    assert outcome["errors"][winner] == [] and len(outcome["errors"][loser]) == 4
    for error in outcome["errors"][loser]:
        assert "another run is saving checkpoints into" in error
        assert f"pid {outcome['pids'][winner]} on host" in error, error
    assert (outcome["mixed"], outcome["lost"], outcome["complete"]) == ([], [], 4)


def test_a_killed_run_does_not_leave_the_project_dir_locked(tmp_path):
    project = tmp_path / "project"
    first = _run(project, 1, 10_000, tmp_path)
    line = first.stdout.readline()
    assert json.loads(line)["location"], line + first.stderr.read()

    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=config)
    model = accelerator.prepare(torch.nn.Linear(64, 64))
    with pytest.raises(
        CheckpointError, match=rf"another run is saving checkpoints into .*pid {first.pid} on host"
    ):
        accelerator.save_state()

    first.send_signal(signal.SIGKILL)  # mid-save, most likely: the kernel releases its lock
    first.wait(timeout=60)
    first.stdout.close()
    first.stderr.close()
    # This run resumes where the killed one left off and saves on.
    accelerator.register_for_checkpointing(_Identity())
    resumed = accelerator.load_state()
    saved = accelerator.save_state()
    assert rotation.checkpoint_number(saved) == rotation.checkpoint_number(resumed) + 1
    assert manifests.is_complete(saved) and model.weight is not None


class _Identity:
    def __init__(self):
        self.state = {"run": 0, "save": 0}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def test_load_state_takes_the_newest_checkpoint_that_verifies_and_says_which_it_skipped(tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=config)
    model = accelerator.prepare(torch.nn.Linear(8, 8))
    saved = {}
    for number in range(3):
        with torch.no_grad():
            model.weight.fill_(float(number))
        saved[number] = accelerator.save_state()
    # The newest one is damaged after the save (a flipped byte: sizes still match, checksums do not).
    path = os.path.join(saved[2], "model.safetensors")
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with torch.no_grad():
        model.weight.fill_(-1.0)
    with pytest.warns(
        CheckpointWarning, match=r"skipped checkpoint_2 \(.*does not match its xxh3_128 checksum"
    ):
        assert accelerator.load_state() == saved[1]
    assert bool((model.weight == 1.0).all())
    assert accelerator.save_iteration == 2
