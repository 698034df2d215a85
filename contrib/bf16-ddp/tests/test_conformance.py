"""The backend passes the drivetrain conformance suite with one and two processes."""

import pytest


def test_conforms_in_one_process(drivetrain_conformance):
    drivetrain_conformance.check("bf16-ddp", processes=1)


@pytest.mark.multiprocess
def test_conforms_in_two_processes(drivetrain_conformance):
    drivetrain_conformance.check("bf16-ddp", processes=2)
