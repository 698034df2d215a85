"""Accelerate's ``accelerate.utils.modeling``: model sizes, device maps, tied parameters, loading checkpoints
into (big) models. drivetrain's planning and loading live in :mod:`drivetrain.big_modeling`; the helpers with
Accelerate's own signatures in :mod:`drivetrain.big_modeling.tensors`."""

from typing import Any

from drivetrain.contract.reexport import LOGGER, reexport


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` (once unwrapped) is a peft ``PeftModel``."""
    from drivetrain.utils.imports import is_peft_available

    if not is_peft_available():
        return False
    from peft import PeftModel

    from drivetrain.training.modeling import extract_model_from_parallel

    return isinstance(extract_model_from_parallel(model), PeftModel)


_TENSORS = (
    "calculate_maximum_sizes check_device_same check_tied_parameters_in_config check_tied_parameters_on_same_device "
    "clean_device_map compute_module_sizes compute_module_total_buffer_size convert_file_size_to_int dtype_byte_size "
    "get_grad_scaler get_max_layer_size get_mixed_precision_context_manager get_module_leaves "
    "get_module_size_with_ties get_non_persistent_buffers get_state_dict_from_offload get_state_dict_offloaded_model "
    "id_tensor_storage load_offloaded_weights load_state_dict named_module_tensors retie_parameters "
    "set_module_tensor_to_device"
).split()

__getattr__, __dir__, _names = reexport(
    __name__,
    {
        **dict.fromkeys(_TENSORS, "drivetrain.big_modeling.tensors"),
        "find_tied_parameters": "drivetrain.big_modeling.device_map",
        "check_device_map": "drivetrain.big_modeling.device_map",
        "infer_auto_device_map": "drivetrain.big_modeling.device_map",
        "get_max_memory": "drivetrain.big_modeling.sizes",
        "get_balanced_memory": "drivetrain.big_modeling.sizes",
        "load_checkpoint_in_model": "drivetrain.big_modeling.loading",
        "WEIGHTS_INDEX_NAME": "drivetrain.constants",
        "logger": LOGGER,
    },
)
__all__ = sorted([*_names, "is_peft_model"])
