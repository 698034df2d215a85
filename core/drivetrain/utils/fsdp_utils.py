"""Accelerate's ``accelerate.utils.fsdp_utils``: names of a backend plugin."""

from drivetrain.contract.reexport import LOGGER, reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {
        "logger": LOGGER,
    },
)
