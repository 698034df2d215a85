"""Process helpers that need the shared state."""

from __future__ import annotations


def wait_for_everyone() -> None:
    """Block until every process of the run reaches this point."""
    from drivetrain.state import PartialState

    PartialState().wait_for_everyone()
