"""Helpers for tests that need real processes (torch's elastic launcher, gloo on loopback), for drivetrain's
tests and plugins' (docs/plugins/testing.md). Scripts import them from ``drivetrain.testing``, a path generated
from its table in drivetrain.compat.paths."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence


def launch_script(
    script: str,
    num_processes: int = 2,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``script`` in ``num_processes`` CPU processes through ``torch.distributed.run`` and return the
    completed process (stdout and stderr captured as text). Raises AssertionError with the output when a
    rank fails and ``check`` is true."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={num_processes}",
        "--monitor_interval=0.1",
        script,
        *args,
    ]
    result = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{num_processes}-process run of {script} failed with exit code {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


def checks_reported_ok(stdout: str) -> set[str]:
    """Names of the checks a launched script reported as ``CHECK <name> ok`` lines."""
    return {
        line.split()[1] for line in stdout.splitlines() if line.startswith("CHECK ") and line.endswith(" ok")
    }


def assert_checks_passed(result: subprocess.CompletedProcess, expected: Sequence[str]) -> None:
    """Every check in ``expected`` reported ok (a launched script prints ``CHECK <name> ok`` per check), and
    no rank aborted at exit."""
    missing = sorted(set(expected) - checks_reported_ok(result.stdout))
    assert not missing, f"checks that did not report ok: {missing}\n{result.stdout[-3000:]}"
    assert "terminate called" not in result.stderr


def install_plugin_for_test(
    site: str | os.PathLike,
    name: str,
    module_source: str,
    distribution: str | None = None,
    groups: Sequence[str] = ("drivetrain.plugins",),
) -> dict[str, str]:
    """Install a plugin the way pip would, into ``site`` (a folder): its module ``<name>_plugin.py`` and a
    ``.dist-info`` folder whose entry points name it in ``groups``. Returns the environment variables
    (``PYTHONPATH``) under which a subprocess discovers it; ``sys.path.insert(0, site)`` does the same here."""
    folder = os.fspath(site)
    module = f"{name.replace('-', '_')}_plugin"
    distribution = distribution or f"drivetrain-test-{name}"
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{module}.py"), "w", encoding="utf-8") as handle:
        handle.write(module_source)
    dist_info = os.path.join(folder, f"{distribution.replace('-', '_')}-0.1.dist-info")
    os.makedirs(dist_info, exist_ok=True)
    with open(os.path.join(dist_info, "METADATA"), "w", encoding="utf-8") as handle:
        handle.write(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    with open(os.path.join(dist_info, "entry_points.txt"), "w", encoding="utf-8") as handle:
        handle.write("".join(f"[{group}]\n{name} = {module}\n\n" for group in groups))
    path = os.pathsep.join(part for part in (folder, os.environ.get("PYTHONPATH", "")) if part)
    return {"PYTHONPATH": path}
