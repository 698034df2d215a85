"""The drivetrain conformance suite (the ``drivetrain_conformance`` fixture and the ``multiprocess`` mark come
from the pytest plugin of ``drivetrain-conformance``)."""

import pytest

PLUGIN = "{{ cookiecutter.plugin_name }}"


def test_conforms_in_one_process(drivetrain_conformance):
    drivetrain_conformance.check(PLUGIN, processes=1)


@pytest.mark.multiprocess
def test_conforms_in_two_processes(drivetrain_conformance):
    report = drivetrain_conformance.check(PLUGIN, processes=2)
    assert report.status("multi_process_matches_combined_batch") == "pass"
    assert report.status("adamw_schedule_matches_local") == "pass"
