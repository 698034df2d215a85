"""The conformance suite against backend xla on torch_xla's CPU device (pinned xla env; slow: every check
starts a process that imports torch_xla). The suite's own tolerances apply (fp32: 1e-5 + 1e-4*|ref|).
Not run on TPU hardware."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.needs_xla, pytest.mark.slow]


def test_conformance_over_xla(drivetrain_conformance, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    drivetrain_conformance.check("xla", processes=1)
