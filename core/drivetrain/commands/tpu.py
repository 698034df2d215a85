"""Accelerate's ``accelerate.commands.tpu``: provided by a plugin (importable here; using a name says which
distribution to install). ``drivetrain`` accepts the command's options either way (see
:mod:`drivetrain.commands.plugin_commands`)."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(__name__, {})
