"""Checkpoints under several real processes (gloo on loopback): a rank SIGKILLed in the middle of a save
never costs the previous checkpoint, a rank that raises makes every rank raise instead of hanging, and
save_on_each_node gives every machine its own complete copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint import rotation
from drivetrain.commands.launch import free_port
from drivetrain.testing import assert_checks_passed, launch_script

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "ckpt_multiprocess.py")
pytestmark = pytest.mark.multiprocess

# (rank(s) killed, where, the checkpoint load_state() must then pick)
KILL_POINTS = [
    ("0", "file:1", 0),  # rank 0 wrote the model file of checkpoint_1, rank 1 waits for it
    ("1", "file:1", 0),  # rank 1 wrote its RNG state, rank 0 is still writing
    ("all", "file:1", 0),  # the whole group dies, each after its first file
    ("0", "manifest_written", 0),  # manifest complete, folder not yet renamed
    ("0", "renamed", 1),  # checkpoint_1 in place, checkpoint_0 not yet pruned
]
RESUME_CHECKS = [
    "picked_previous",
    "weights_restored",
    "weights_changed",
    "optimizer_restored",
    "next_number",
    "leftovers_cleared",
]


@pytest.mark.parametrize(
    ("kill_rank", "kill_at", "survivor"), KILL_POINTS, ids=[f"rank{r}-{at}" for r, at, _ in KILL_POINTS]
)
def test_sigkill_of_a_rank_during_save_keeps_the_previous_checkpoint(tmp_path, kill_rank, kill_at, survivor):
    env = {"TMPDIR": str(tmp_path), "CKPT_KILL_AT": kill_at, "CKPT_KILL_RANK": kill_rank}
    crashed = launch_script(SCRIPT, 2, args=["crash", str(tmp_path)], env=env, timeout=180, check=False)
    output = crashed.stdout + crashed.stderr
    assert crashed.returncode != 0, output
    assert "without being killed" not in output
    assert "SIGKILL" in output or "exitcode  : -9" in output, output[-3000:]

    root = tmp_path / "checkpoints"
    complete = [os.path.basename(p) for p in rotation.complete_checkpoints(str(root))]
    assert complete[-1] == f"checkpoint_{survivor}"
    if survivor == 0:
        assert not (root / "checkpoint_1").exists(), "a partial save is visible under its final name"

    resumed = launch_script(SCRIPT, 2, args=["resume", str(tmp_path), str(survivor)], env=env, timeout=180)
    assert_checks_passed(resumed, RESUME_CHECKS)


@pytest.mark.parametrize("who", ["object", "hook"])
def test_a_rank_that_raises_during_save_makes_every_rank_raise(tmp_path, who):
    # Without agreement the other rank would wait at a barrier forever; the timeout turns that into a failure.
    result = launch_script(
        SCRIPT, 2, args=["fail", str(tmp_path), who], env={"TMPDIR": str(tmp_path)}, timeout=180
    )
    assert result.stdout.count(" raised: ") == 2, result.stdout
    assert_checks_passed(
        result,
        [
            "every_rank_raised_naming_the_failed_rank",
            "previous_is_latest",
            "no_leftover_folder",
            "tampered_load_refused_everywhere",
            "nothing_applied",
            "optimizer_untouched",
            "saved_weights_differ",
        ],
    )


def test_a_save_that_fails_while_finishing_in_the_background_raises_on_every_rank(tmp_path):
    result = launch_script(
        SCRIPT, 2, args=["finish", str(tmp_path)], env={"TMPDIR": str(tmp_path)}, timeout=180
    )
    assert result.stdout.count(" raised: ") == 2, result.stdout
    assert_checks_passed(
        result,
        [
            "every_rank_raised_at_the_next_wait",
            "previous_is_latest",
            "no_leftover_folder",
            "next_save_completes",
        ],
    )


def _launch_machine(tmp_path: Path, machine_rank: int, port: int, each: bool) -> subprocess.Popen:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "DRIVETRAIN_CONFIG_DIR": str(tmp_path / "no-config"),
    }
    command = [
        sys.executable,
        "-m",
        "drivetrain.launch",
        "--cpu",
        "--num_processes",
        "4",
        "--num_machines",
        "2",
        "--machine_rank",
        str(machine_rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        SCRIPT,
        "nodes",
        str(tmp_path / "runs"),
        "1" if each else "0",
    ]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )


@pytest.mark.parametrize("each", [True, False], ids=["save_on_each_node", "main_only"])
def test_two_machines_save_on_each_node(tmp_path, each):
    port = free_port()
    machines = [_launch_machine(tmp_path, rank, port, each) for rank in (0, 1)]
    results = []
    for machine in machines:
        out, err = machine.communicate(timeout=240)
        results.append((machine.returncode, out, err))
    for code, out, err in results:
        assert code == 0, out[-3000:] + err[-3000:]
    main = subprocess.CompletedProcess([], 0, results[0][1], results[0][2])
    assert_checks_passed(
        main,
        [
            "manifest_lists_local_rng_states",
            "loaded_own_machines_copy",
            "weights_restored",
            "equal_on_every_rank",
        ],
    )

    runs = tmp_path / "runs"
    manifests_found = sorted(
        str(Path(root).relative_to(runs))
        for root, _dirs, names in os.walk(runs)
        if manifests.MANIFEST_NAME in names
    )
    if each:
        # Each machine's local main process wrote a complete checkpoint of its own, with its ranks' RNG states.
        assert manifests_found == ["node0/checkpoints/checkpoint_0", "node1/checkpoints/checkpoint_0"]
        for node, ranks in (("node0", [0, 1]), ("node1", [2, 3])):
            listed = manifests.verify(str(runs / node / "checkpoints" / "checkpoint_0"))["files"]
            assert sorted(n for n in listed if n.startswith("random_states")) == [
                f"random_states_{r}.pkl" for r in ranks
            ]
    else:
        # Only the global main process wrote one; it holds every rank's RNG state (the storage is shared).
        assert manifests_found == ["shared/checkpoints/checkpoint_0"]
        listed = manifests.verify(str(runs / "shared" / "checkpoints" / "checkpoint_0"))["files"]
        assert sorted(n for n in listed if n.startswith("random_states")) == [
            f"random_states_{r}.pkl" for r in range(4)
        ]
