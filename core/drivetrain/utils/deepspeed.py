"""Accelerate's ``accelerate.utils.deepspeed``: names of a backend plugin."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {},
)
