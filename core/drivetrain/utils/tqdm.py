"""Accelerate's ``accelerate.utils.tqdm``: the progress bar shown on the main process only."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {
        "tqdm": "drivetrain.progress",
    },
)
