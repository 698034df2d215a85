"""Accelerate's ``accelerate.utils.random``: seeding and synchronising random number generators."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    {
        "set_seed": "drivetrain.operations.random",
        "synchronize_rng_state": "drivetrain.operations.random",
        "synchronize_rng_states": "drivetrain.operations.random",
    },
)
