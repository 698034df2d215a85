"""Accelerate's ``accelerate.utils.transformer_engine``: names of the precision plugin."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {},
)
