"""Experiment trackers: the base class a tracker plugin subclasses (``registry.add_tracker``)."""

from __future__ import annotations

from drivetrain.tracking import GeneralTracker, on_main_process

__all__ = ["GeneralTracker", "on_main_process"]
