"""Accelerate's ``accelerate.utils.rich``: importing it installs rich's traceback handler (as Accelerate's
does); without rich installed the import fails saying how to install it."""

from drivetrain.utils.imports import is_rich_available

if not is_rich_available():
    raise ModuleNotFoundError("drivetrain.utils.rich needs rich: pip install rich")

from rich.traceback import install

install(show_locals=False)
