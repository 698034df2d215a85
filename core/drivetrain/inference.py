"""Accelerate's ``accelerate.inference`` (pipeline-parallel inference): names of a plugin."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {},
)
