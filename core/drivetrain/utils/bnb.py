"""Accelerate's ``accelerate.utils.bnb`` (bitsandbytes quantization): names of a quantization plugin."""

from drivetrain.contract.reexport import LOGGER, reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {
        "logger": LOGGER,
    },
)
