"""A misbehaving installed plugin is named, skipped and shown as broken; every command and script goes on
(issue 23, finding 4; issue 29, finding 7: a hang in C holding the GIL, a plugin that ends its process,
closes stdout or starts a thread that is not a daemon). Real installed plugins: an entry point in a
temporary site folder, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from drivetrain.testing import install_plugin_for_test

MISBEHAVIOURS = {
    "exit": ("import sys\nsys.exit(3)\n", "it called sys.exit(3) while importing"),
    "system_exit": ("raise SystemExit('bye')\n", "it called sys.exit('bye') while importing"),
    "interrupt": ("raise KeyboardInterrupt\n", "KeyboardInterrupt raised while importing"),
    "hang": (
        "import time\ntry:\n    time.sleep(3600)\nexcept Exception:\n    time.sleep(3600)\n",
        "it did not finish importing within 5 s (DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT)",
    ),
    "error": ("raise RuntimeError('broken on purpose')\n", "RuntimeError: broken on purpose"),
}

# Runs `drivetrain plugins`, then a training script's Accelerator, in one process as a user would in two.
USER = textwrap.dedent(
    """
    import sys, warnings
    import torch  # what a plugin's import would otherwise pay for within the short test limit
    from drivetrain.commands.main import main
    code = main(["plugins"])
    print("PLUGINS EXIT", code, flush=True)
    import torch
    from drivetrain import Accelerator
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator()
        model = accelerator.prepare(torch.nn.Linear(2, 2))
    print("SCRIPT RAN", accelerator.distributed_type, flush=True)
    # a script imports the plugins it uses: these test plugins are none of them
    print("TEST PLUGINS IMPORTED", sorted(m for m in sys.modules if m.endswith("_plugin")), flush=True)
    for warning in caught:
        print("WARNING", warning.message)
    """
)


@pytest.mark.parametrize("behaviour", sorted(MISBEHAVIOURS))
def test_misbehaving_plugin_is_named_skipped_and_listed_broken(tmp_path, behaviour):
    source, reason = MISBEHAVIOURS[behaviour]
    env = install_plugin_for_test(tmp_path / "site", "rogue", source, distribution="rogue-plugin")
    env = {**os.environ, **env, "DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT": "5", "OMP_NUM_THREADS": "1"}
    env["DRIVETRAIN_LOAD_PLUGINS"] = "rogue"  # and the reference backend, always kept: a faster test
    done = subprocess.run([sys.executable, "-c", USER], capture_output=True, text=True, env=env, timeout=300)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert "PLUGINS EXIT 0" in out and "SCRIPT RAN" in out, out + done.stderr
    assert "TEST PLUGINS IMPORTED []" in out
    listed = next(line for line in out.splitlines() if line.startswith("rogue "))
    assert "(rogue-plugin 0.1, ?)  BROKEN: plugin 'rogue' (distribution rogue-plugin 0.1)" in listed
    assert reason in listed, listed
    assert any(line.startswith("local ") and line.endswith(" ok") for line in out.splitlines()), out


def _run(code: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )


def _rogue(tmp_path, source: str) -> dict[str, str]:
    env = install_plugin_for_test(tmp_path / "site", "rogue", source, distribution="rogue-plugin")
    return {**os.environ, **env, "OMP_NUM_THREADS": "1", "DRIVETRAIN_LOAD_PLUGINS": "rogue"}


#: Issue 29, finding 7: what a thread with a time limit cannot stop, installed together (one listing meets
#: them in turn and goes on after each). pause() called through PyDLL keeps the GIL: the thread waiting for
#: the import never runs again.
PROCESS_TAKERS = {
    "gil": (
        "import ctypes\nctypes.PyDLL(None).pause()\n",
        "it did not finish importing within 5 s (DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT)",
    ),
    "exits": ("import os\nos._exit(7)\n", "it ended the process (exit code 7) while importing"),
    "kills": (
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "the process was killed by SIGKILL while importing it",
    ),
}


def test_plugins_that_hang_holding_the_gil_or_end_their_process_are_each_named_and_skipped(tmp_path):
    env = {}
    for name, (source, _) in PROCESS_TAKERS.items():
        env = install_plugin_for_test(tmp_path / "site", name, source, distribution=f"{name}-plugin")
    env = {**os.environ, **env, "DRIVETRAIN_PLUGIN_IMPORT_TIMEOUT": "5", "OMP_NUM_THREADS": "1"}
    env["DRIVETRAIN_LOAD_PLUGINS"] = ",".join(PROCESS_TAKERS)
    done = subprocess.run([sys.executable, "-c", USER], capture_output=True, text=True, env=env, timeout=300)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert "PLUGINS EXIT 0" in out and "SCRIPT RAN" in out, out + done.stderr
    listed = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    for name, (_, reason) in PROCESS_TAKERS.items():
        assert (
            f"({name}-plugin 0.1, ?)  BROKEN: plugin {name!r} (distribution {name}-plugin 0.1)"
            in listed[name]
        )
        assert reason in listed[name], listed[name]
    assert listed["local"].endswith(" ok")
    assert "TEST PLUGINS IMPORTED []" in out  # the script, on the reference backend, imported none of them


def test_plugins_that_close_stdout_or_start_a_non_daemon_thread_are_named_and_harm_nothing(tmp_path):
    install_plugin_for_test(tmp_path / "site", "closer", "import sys\nsys.stdout.close()\n")
    env = install_plugin_for_test(
        tmp_path / "site",
        "poller",
        "import os, threading, time\n"
        "threading.Thread(target=time.sleep, args=(float(os.environ.get('POLLER_SLEEP', '3600')),),"
        " name='poller-thread', daemon=False).start()\n",
    )
    env = {**os.environ, **env, "OMP_NUM_THREADS": "1", "DRIVETRAIN_LOAD_PLUGINS": "closer,poller"}
    # the listing neither crashes on the closed stdout nor waits an hour for the thread
    listing = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "plugins"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert listing.returncode == 0, listing.stderr
    listed = {
        line.split()[0]: line for line in listing.stdout.splitlines() if line and not line.startswith(" ")
    }
    assert listed["closer"].endswith(" ok") and listed["poller"].endswith(" ok"), listing.stdout
    # A script that loads them still prints, and is told which plugin keeps its process alive (here for 2 s).
    script = textwrap.dedent(
        """
        from drivetrain.contract.registry import get_plugin_registry
        get_plugin_registry().load("closer")
        get_plugin_registry().load("poller")
        print("STILL PRINTING")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**env, "POLLER_SLEEP": "2"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "STILL PRINTING" in done.stdout
    assert (
        "drivetrain: plugin 'closer' (distribution drivetrain-test-closer) closed sys.stdout while importing; it "
        "was opened again" in done.stderr
    )
    assert (
        "drivetrain: plugin 'poller' (distribution drivetrain-test-poller) started thread(s) 'poller-thread' "
        "that are not daemons, so this process cannot end before they do" in done.stderr
    )
