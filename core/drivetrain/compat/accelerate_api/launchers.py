"""Accelerate's ``test_launch`` of ``accelerate.launchers``; ``drivetrain.launchers`` (generated from its table
in drivetrain.compat.paths) serves it with the launchers themselves (drivetrain.launching.forked)."""

from __future__ import annotations


def test_launch() -> None:
    """Creates a ``PartialState`` (what ``accelerate test`` runs first to see that launching works)."""
    from drivetrain.state import PartialState

    PartialState()
