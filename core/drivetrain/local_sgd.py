"""Accelerate's ``accelerate.local_sgd``: ``LocalSGD``, provided by the data-parallel plugin."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {},
)
