"""A misbehaving installed plugin is named, skipped and shown as broken; every command and script goes on
(issue 23, finding 4). Real installed plugins: an entry point in a temporary site folder, real processes."""

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
    listed = next(line for line in out.splitlines() if line.startswith("rogue "))
    assert "(rogue-plugin 0.1, ?)  BROKEN: plugin 'rogue' (distribution rogue-plugin 0.1)" in listed
    assert reason in listed, listed
    assert any(line.startswith("local ") and line.endswith(" ok") for line in out.splitlines()), out
