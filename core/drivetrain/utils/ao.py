"""Accelerate's ``accelerate.utils.ao`` (8-bit float through torchao): names of the precision plugin."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {},
)
