"""The zero1 backend passes the drivetrain conformance suite with two processes (its one-process run is
plain local training, checked by the template's tests)."""

import pytest


@pytest.mark.multiprocess
@pytest.mark.slow
def test_conforms_in_two_processes(drivetrain_conformance):
    report = drivetrain_conformance.check("zero1", processes=2)
    for name in ("adamw_schedule_matches_local", "checkpoint_portable", "sharded_state"):
        assert report.status(name) == "pass", report.format()
