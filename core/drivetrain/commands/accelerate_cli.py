"""Accelerate's ``accelerate.commands.accelerate_cli``: the console command's ``main``."""

from drivetrain.commands.main import main

__all__ = ["main"]
