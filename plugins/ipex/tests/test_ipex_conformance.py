"""The conformance suite with ipex asked for by every Accelerator of the checks (``--plugins ipex``), over
the reference backend and over ddp (needs IPEX; slow: each launch imports IPEX in every process).

The suite checks backends; a device plugin is checked by naming it in every Accelerator the checks build
(``Accelerator(backend=..., plugins=["ipex"])``) while the oracle stays the reference backend alone. The
suite's own tolerances apply (fp32: 1e-5 + 1e-4*|ref|; bf16: 5e-3 + 1e-2*|ref|)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.needs_ipex, pytest.mark.slow]


def test_conformance_over_local(drivetrain_conformance):
    drivetrain_conformance.check("local", processes=1, plugins=("ipex",))


@pytest.mark.multiprocess
def test_conformance_over_ddp(drivetrain_conformance):
    drivetrain_conformance.check("ddp", processes=2, plugins=("ipex",))
