"""The drivetrain conformance suite (the ``drivetrain_conformance`` fixture comes from the pytest plugin
of ``drivetrain-conformance``)."""

import pytest

PLUGIN = "{{ cookiecutter.plugin_name }}"


def test_conforms_in_one_process(drivetrain_conformance):
    drivetrain_conformance.check(PLUGIN, processes=1)


@pytest.mark.multiprocess
def test_conforms_in_two_processes(drivetrain_conformance):
    report = drivetrain_conformance.check(PLUGIN, processes=2)
    # Until PLUGIN_INFO declares multi_process=True, every run-time property reports "n/a" here.
    assert report.status("hooks_match_spec") == "pass"
