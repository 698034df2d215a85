"""Accelerate's ``is_*_available`` checks that name a library or device are typed specifications
(compat.availability.AvailabilitySpec), evaluated by compat.accelerate_api.availability_checks field by field."""

from __future__ import annotations

import dataclasses

import pytest

from drivetrain.compat import availability
from drivetrain.compat.accelerate_api import availability_checks
from drivetrain.compat.availability import AvailabilitySpec, Device, Package


def test_every_specification_is_typed_and_frozen():
    for name, spec in availability.ACCELERATE_AVAILABILITY.items():
        assert isinstance(spec, AvailabilitySpec), name
        assert all(isinstance(package, Package) for package in spec.packages), name
        assert spec.device is None or isinstance(spec.device, Device), name
        assert all(other in availability.ACCELERATE_AVAILABILITY for other in spec.any_of), name
    with pytest.raises(dataclasses.FrozenInstanceError):
        availability.ACCELERATE_AVAILABILITY["is_mps_available"].min_torch = "0"  # type: ignore[misc]


@pytest.fixture
def specs(monkeypatch):
    """Specifications of made-up checks, evaluated afresh (the evaluator caches its answers)."""
    table = dict(availability.ACCELERATE_AVAILABILITY)
    monkeypatch.setattr(availability, "ACCELERATE_AVAILABILITY", table)
    availability_checks._evaluate.cache_clear()
    yield table
    availability_checks._evaluate.cache_clear()


def test_the_evaluator_reads_each_field(specs, monkeypatch):
    installed = Package("pytest")
    made_up = {
        "is_installed": AvailabilitySpec(packages=(installed,)),
        "is_missing": AvailabilitySpec(packages=(Package("drivetrain_no_such_library"),)),
        "is_either": AvailabilitySpec(packages=(Package("drivetrain_no_such_library"), installed)),
        "is_too_old": AvailabilitySpec(packages=(Package("pytest", None, "999.0"),)),
        "is_any": AvailabilitySpec(any_of=("is_missing", "is_installed")),
        "is_none": AvailabilitySpec(any_of=("is_missing", "is_too_old")),
        "is_switched_off": AvailabilitySpec(packages=(installed,), env=("DRIVETRAIN_TEST_SWITCH", "false")),
        "is_switched_on": AvailabilitySpec(packages=(installed,), env=("DRIVETRAIN_TEST_SWITCH_ON", "true")),
        "is_future_torch": AvailabilitySpec(packages=(installed,), min_torch="999.0"),
        "is_no_device": AvailabilitySpec(device=Device("drivetrain_no_such_device")),
        "is_no_vendor_package": AvailabilitySpec(device=Device("cpu", "drivetrain_no_such_extension")),
    }
    specs.update(made_up)
    monkeypatch.delenv("DRIVETRAIN_TEST_SWITCH", raising=False)
    monkeypatch.delenv("DRIVETRAIN_TEST_SWITCH_ON", raising=False)
    answers = {name: availability_checks._evaluate(name) for name in made_up}
    assert answers == {
        "is_installed": True,
        "is_missing": False,
        "is_either": True,
        "is_too_old": False,
        "is_any": True,
        "is_none": False,
        "is_switched_off": False,
        "is_switched_on": True,
        "is_future_torch": False,
        "is_no_device": False,
        "is_no_vendor_package": False,
    }
    availability_checks._evaluate.cache_clear()
    monkeypatch.setenv("DRIVETRAIN_TEST_SWITCH", "1")
    assert availability_checks._evaluate("is_switched_off") is True


def test_the_checks_answer_through_accelerates_paths():
    import drivetrain.utils
    import drivetrain.utils.imports

    for name in availability.ACCELERATE_AVAILABILITY:
        check = getattr(drivetrain.utils.imports, name)
        assert check is getattr(drivetrain.utils, name)
        assert isinstance(check(), bool)
