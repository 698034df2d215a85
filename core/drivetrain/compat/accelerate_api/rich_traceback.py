"""Imported when ``drivetrain.utils.rich`` (Accelerate's ``accelerate.utils.rich``) is: installs rich's traceback
handler, as Accelerate's does; without rich installed the import fails saying how to install it
(:data:`drivetrain.compat.paths.ON_IMPORT`)."""

from drivetrain.compat.accelerate_api.availability_checks import is_rich_available

if not is_rich_available():
    raise ModuleNotFoundError("drivetrain.utils.rich needs rich: pip install rich")

from rich.traceback import install

install(show_locals=False)
