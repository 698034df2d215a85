"""``drivetrain.utils``: the documented helper names, importable as ``from drivetrain.utils import X``.

Everything resolves lazily; names that belong to a backend plugin (``DeepSpeedPlugin``) resolve when the
plugin is installed and otherwise raise an ImportError naming the distribution to install.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    # configuration objects and kwargs handlers
    "ProjectConfiguration": "drivetrain.config.dataclasses",
    "DataLoaderConfiguration": "drivetrain.config.dataclasses",
    "GradientAccumulationPlugin": "drivetrain.config.dataclasses",
    "TorchDynamoPlugin": "drivetrain.config.dataclasses",
    "ParallelismConfig": "drivetrain.config.parallelism",
    "TorchTensorParallelConfig": "drivetrain.config.parallelism",
    "TorchContextParallelConfig": "drivetrain.config.parallelism",
    "TorchTensorParallelPlugin": "drivetrain.config.parallelism",
    "KwargsHandler": "drivetrain.config.kwargs_handlers",
    "AutocastKwargs": "drivetrain.config.kwargs_handlers",
    "GradScalerKwargs": "drivetrain.config.kwargs_handlers",
    "InitProcessGroupKwargs": "drivetrain.config.kwargs_handlers",
    "ProfileKwargs": "drivetrain.config.kwargs_handlers",
    # enums
    "DistributedType": "drivetrain.config.enums",
    "PrecisionType": "drivetrain.config.enums",
    "RNGType": "drivetrain.config.enums",
    "LoggerType": "drivetrain.config.enums",
    "DynamoBackend": "drivetrain.config.enums",
    "ComputeEnvironment": "drivetrain.config.enums",
    "SageMakerDistributedType": "drivetrain.config.enums",
    # operations
    "gather": "drivetrain.operations",
    "gather_object": "drivetrain.operations",
    "broadcast": "drivetrain.operations",
    "broadcast_object_list": "drivetrain.operations",
    "reduce": "drivetrain.operations",
    "pad_across_processes": "drivetrain.operations",
    "concatenate": "drivetrain.operations",
    "send_to_device": "drivetrain.operations",
    "slice_tensors": "drivetrain.operations",
    "recursively_apply": "drivetrain.operations",
    "find_batch_size": "drivetrain.operations",
    "convert_to_fp32": "drivetrain.operations",
    "get_data_structure": "drivetrain.operations",
    "initialize_tensors": "drivetrain.operations",
    "honor_type": "drivetrain.operations",
    "is_namedtuple": "drivetrain.operations",
    "listify": "drivetrain.operations",
    "copy_tensor_to_devices": "drivetrain.operations",
    "convert_outputs_to_fp32": "drivetrain.operations",
    "gather_for_metrics": "drivetrain.operations",
    "DistributedOperationException": "drivetrain.operations",
    "TensorInformation": "drivetrain.operations",
    # randomness
    "set_seed": "drivetrain.operations.random",
    "synchronize_rng_state": "drivetrain.operations.random",
    "synchronize_rng_states": "drivetrain.operations.random",
    # processes, memory, environment
    "wait_for_everyone": "drivetrain.utils._process",
    "release_memory": "drivetrain.operations.memory",
    "find_executable_batch_size": "drivetrain.operations.memory",
    "should_reduce_batch_size": "drivetrain.operations.memory",
    "patch_environment": "drivetrain.environment",
    "clear_environment": "drivetrain.environment",
    "extract_model_from_parallel": "drivetrain.training.modeling",
    "save": "drivetrain.checkpointing",
    "clean_state_dict_for_safetensors": "drivetrain.checkpointing",
    # logging and progress
    "get_logger": "drivetrain.logging",
    "tqdm": "drivetrain.progress",
    "GeneralTracker": "drivetrain.tracking",
    "write_basic_config": "drivetrain.config.file",
    "notebook_launcher": "drivetrain.launchers",
    "debug_launcher": "drivetrain.launchers",
    "on_main_process": "drivetrain.tracking",
    # big-model planning and loading
    "init_empty_weights": "drivetrain.big_modeling",
    "init_on_device": "drivetrain.big_modeling",
    "compute_module_sizes": "drivetrain.big_modeling",
    "get_max_memory": "drivetrain.big_modeling",
    "get_balanced_memory": "drivetrain.big_modeling",
    "infer_auto_device_map": "drivetrain.big_modeling",
    "load_checkpoint_in_model": "drivetrain.big_modeling",
    "load_checkpoint_and_dispatch": "drivetrain.big_modeling",
    "dispatch_model": "drivetrain.big_modeling",
    "find_tied_parameters": "drivetrain.big_modeling",
    "check_device_map": "drivetrain.big_modeling",
    # checkpoint file names
    "WEIGHTS_NAME": "drivetrain.constants",
    "SAFE_WEIGHTS_NAME": "drivetrain.constants",
    "WEIGHTS_INDEX_NAME": "drivetrain.constants",
    "SAFE_WEIGHTS_INDEX_NAME": "drivetrain.constants",
    "MODEL_NAME": "drivetrain.constants",
    "OPTIMIZER_NAME": "drivetrain.constants",
    "RNG_STATE_NAME": "drivetrain.constants",
    "SCALER_NAME": "drivetrain.constants",
    "SCHEDULER_NAME": "drivetrain.constants",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    from drivetrain.contract.exports import lazy_getattr

    value = lazy_getattr(__name__, {key: f"{module}:{key}" for key, module in _EXPORTS.items()}, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
