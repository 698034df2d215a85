"""Accelerate's ``accelerate.utils.offload``: writing tensors to an offload folder and reading them back
(see :mod:`drivetrain.big_modeling.memmap_offload`)."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(
    __name__,
    dict.fromkeys(
        (
            "OffloadedWeightsLoader PrefixedDataset extract_submodules_state_dict load_offloaded_weight "
            "offload_state_dict offload_weight save_offload_index"
        ).split(),
        "drivetrain.big_modeling.memmap_offload",
    ),
)
