"""The examples in README and docs run and do what they claim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_trains_to_high_accuracy_on_one_process(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--epochs", "20"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    accuracy = float(result.stdout.strip().splitlines()[-1].split()[1])
    assert accuracy >= 0.95
