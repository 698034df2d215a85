"""Accelerate's module paths (``accelerate.utils.modeling`` -> ``drivetrain.utils.modeling``): which names each
path holds that spell a backend (kernel-provided) or that a plugin provides (with the distribution to install)."""

from drivetrain.compat.availability import ACCELERATE_AVAILABILITY
from drivetrain.compat.distributions import (
    PIPELINE_DISTRIBUTION,
    QUANTIZATION_DISTRIBUTION,
    SAGEMAKER_DISTRIBUTION,
    TRACKERS_DISTRIBUTION,
)

#: Accelerate's module hooks (``accelerate.hooks``), provided by the offload plugin.
MODULE_HOOK_NAMES = (
    "ModelHook",
    "SequentialHook",
    "AlignDevicesHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
)

#: Accelerate's offloading functions (``accelerate.big_modeling``), provided by the offload plugin.
OFFLOAD_FUNCTION_NAMES = (
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "has_offloaded_params",
    "align_module_device",
)

#: Accelerate's backend-specific Accelerator keyword arguments; each is an alias of ``backend_config=``.
BACKEND_CONFIG_KWARGS = ("deepspeed_plugin", "fsdp_plugin", "megatron_lm_plugin")

#: Accelerate's type aliases in ``utils.dataclasses`` (``typing.Literal`` values).
ACCELERATE_LITERALS = {
    "Backend": ("MSAMP", "TE"),
    "OptLevel": ("O1", "O2"),
    "ProfilerActivity": ("cpu", "xpu", "mtia", "cuda", "hpu"),
}

#: Accelerate's constants that name a backend (``accelerate.utils.constants``), same values.
ACCELERATE_BACKEND_CONSTANTS = {
    "FSDP_SHARDING_STRATEGY": [
        "FULL_SHARD",
        "SHARD_GRAD_OP",
        "NO_SHARD",
        "HYBRID_SHARD",
        "HYBRID_SHARD_ZERO2",
    ],
    "FSDP_AUTO_WRAP_POLICY": ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"],
    "FSDP_BACKWARD_PREFETCH": ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"],
    "FSDP_STATE_DICT_TYPE": ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"],
    "FSDP2_STATE_DICT_TYPE": ["SHARDED_STATE_DICT", "FULL_STATE_DICT"],
    "FSDP_PYTORCH_VERSION": "2.1.0.a0+32f93b1",
    "FSDP2_PYTORCH_VERSION": "2.6.0",
    "FSDP_MODEL_NAME": "pytorch_model_fsdp",
    "DEEPSPEED_MULTINODE_LAUNCHERS": ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"],
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION": "2.4.0",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION": "0.18.2",
    "CUDA_DISTRIBUTED_TYPES": ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"],
}

#: Table value for a module's ``logger`` (Accelerate's modules each have one): drivetrain's logger named after the
#: module's path (drivetrain.contract.reexport).
LOGGER = "@logger"

#: Where the code behind Accelerate's utility paths lives (drivetrain.compat.accelerate_api: what exists only
#: because Accelerate has it).
_API = "drivetrain.compat.accelerate_api"
_CHECKS = f"{_API}.availability_checks"
_CONSTANTS = f"{_API}.constants"
_ENVIRONMENT = f"{_API}.environment"
_MACHINE = f"{_API}.machine"
_MODULES = f"{_API}.modules"
_OBJECTS = f"{_API}.objects"
_OPERATIONS = f"{_API}.operations"
_LOAD = f"{_API}.weights_only_load"
_VERSIONS = f"{_API}.versions"
_LAUNCH_HELPERS = f"{_API}.launch_helpers"
_TESTING = f"{_API}.testing_helpers"

#: Names of Accelerate's paths implemented by the kernel whose names spell a backend: path -> name -> target.
KERNEL_NAMES_BY_PATH: dict[str, dict[str, str]] = {
    "accelerate.utils.imports": {
        **dict.fromkeys(ACCELERATE_AVAILABILITY, _CHECKS),
        "torchao_required": f"{_CHECKS}:library_required",
        "deepspeed_required": f"{_CHECKS}:backend_required",
        "USE_TORCH_XLA": f"{_CHECKS}:use_accelerator_runtime",
    },
    "accelerate.utils.constants": dict.fromkeys(ACCELERATE_BACKEND_CONSTANTS, _CONSTANTS),
    "accelerate.utils": {
        **dict.fromkeys(ACCELERATE_AVAILABILITY, _CHECKS),
        "torchao_required": f"{_CHECKS}:library_required",
        "deepspeed_required": f"{_CHECKS}:backend_required",
        "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION": _CONSTANTS,
        "check_cuda_fp8_capability": f"{_MACHINE}:check_cuda_float8_capability",
    },
    "accelerate.utils.dataclasses": dict.fromkeys(ACCELERATE_LITERALS, f"{_API}.type_aliases"),
    "accelerate.utils.environment": {"check_cuda_fp8_capability": f"{_MACHINE}:check_cuda_float8_capability"},
    "accelerate.utils.operations": {"is_torch_xpu_tensor": f"{_OPERATIONS}:is_accelerator_tensor"},
}

_FSDP_UTILS = (
    "disable_fsdp_ram_efficient_loading enable_fsdp_ram_efficient_loading fsdp2_apply_ac fsdp2_canonicalize_names "
    "fsdp2_load_full_state_dict fsdp2_prepare_auto_wrap_policy fsdp2_prepare_model fsdp2_switch_optimizer_parameters "
    "get_fsdp2_grad_scaler load_fsdp_model load_fsdp_optimizer merge_fsdp_weights save_fsdp_model save_fsdp_optimizer "
    "ensure_weights_retied get_parameters_from_modules"
).split()

_DEEPSPEED_UTILS = (
    "DeepSpeedEngineWrapper DeepSpeedOptimizerWrapper DeepSpeedSchedulerWrapper DummyOptim DummyScheduler "
    "HfDeepSpeedConfig get_active_deepspeed_plugin map_pytorch_optim_to_deepspeed"
).split()

_MEGATRON_UTILS = (
    "AbstractTrainStep BertTrainStep GPTTrainStep MegatronEngine MegatronLMDummyDataLoader MegatronLMDummyScheduler "
    "MegatronLMOptimizerWrapper MegatronLMSchedulerWrapper T5TrainStep avg_losses_across_data_parallel_group "
    "finish_mpu_init gather_across_data_parallel_groups initialize model_provider_func "
    "prepare_model_optimizer_scheduler prepare_optimizer prepare_scheduler prepare_data_loader"
).split()

_MEGATRON_IN_UTILS = {
    "megatron_lm_initialize": "initialize",
    "megatron_lm_prepare_data_loader": "prepare_data_loader",
    "megatron_lm_prepare_model_optimizer_scheduler": "prepare_model_optimizer_scheduler",
    "megatron_lm_prepare_optimizer": "prepare_optimizer",
    "megatron_lm_prepare_scheduler": "prepare_scheduler",
}

_MEGATRON_CONFIG = (
    "MegatronLMPlugin MODEL_CONFIGS_TO_MEGATRON_PARSERS add_model_config_to_megatron_parser parse_bert_config "
    "parse_glm4_moe_config parse_gpt2_config parse_llama_config parse_t5_config"
).split()

_FP8_CONFIG = "AORecipeKwargs FP8RecipeKwargs MSAMPRecipeKwargs TERecipeKwargs FP8BackendType FP8Format AmaxComputeAlgorithm"

_TRANSFORMER_ENGINE = (
    "apply_fp8_autowrap contextual_fp8_autocast convert_model has_transformer_engine_layers".split()
)

_AO = (
    "convert_model_to_fp8_ao filter_first_and_last_linear_layers filter_linear_layers find_first_last_linear_layers "
    "has_ao_layers"
).split()

_BNB = (
    "get_keys_to_not_convert get_parameter_device get_quantized_model_device_map has_4bit_bnb_layers "
    "load_and_quantize_model quantize_and_offload_8bit replace_with_bnb_layers"
).split()

_PIPELINE = "build_pipeline find_pippy_batch_size generate_device_map pippy_forward prepare_pippy".split()

_SAGEMAKER_LAUNCH = ["prepare_sagemager_args_inputs"]

_DDP = ["DDPCommunicationHookType", "DistributedDataParallelKwargs"]

_DEEPSPEED_CONFIG = ["DeepSpeedPlugin", "DeepSpeedSequenceParallelConfig"]

#: Names of Accelerate's paths that plugins provide: path -> name -> distribution to install when missing. The
#: installed plugin's ``drivetrain.exports`` entry point of the same name answers.
PLUGIN_NAMES_BY_PATH: dict[str, dict[str, str]] = {
    "accelerate": {
        **dict.fromkeys(_DDP, "drivetrain-ddp"),
        "DeepSpeedPlugin": "drivetrain-deepspeed",
        "FullyShardedDataParallelPlugin": "drivetrain-fsdp",
        **dict.fromkeys(OFFLOAD_FUNCTION_NAMES[:3], "drivetrain-offload"),
        "prepare_pippy": PIPELINE_DISTRIBUTION,
    },
    "accelerate.big_modeling": {
        **dict.fromkeys(OFFLOAD_FUNCTION_NAMES[:3], "drivetrain-offload"),
        "attach_layerwise_casting_hooks": "drivetrain-offload",
    },
    "accelerate.hooks": {
        **dict.fromkeys(MODULE_HOOK_NAMES, "drivetrain-offload"),
        "CpuOffload": "drivetrain-offload",
        "LayerwiseCastingHook": "drivetrain-offload",
    },
    "accelerate.local_sgd": {"LocalSGD": "drivetrain-ddp"},
    "accelerate.tracking": dict.fromkeys(
        "AimTracker ClearMLTracker CometMLTracker DVCLiveTracker MLflowTracker SwanLabTracker TensorBoardTracker "
        "TrackioTracker WandBTracker".split(),
        TRACKERS_DISTRIBUTION,
    ),
    "accelerate.inference": dict.fromkeys(_PIPELINE, PIPELINE_DISTRIBUTION),
    "accelerate.data_loader": {"MpDeviceLoaderWrapper": "drivetrain-xla"},
    "accelerate.utils.deepspeed": dict.fromkeys(_DEEPSPEED_UTILS, "drivetrain-deepspeed"),
    "accelerate.utils.fsdp_utils": dict.fromkeys(_FSDP_UTILS, "drivetrain-fsdp"),
    "accelerate.utils.megatron_lm": dict.fromkeys(_MEGATRON_UTILS, "drivetrain-megatron"),
    "accelerate.utils.transformer_engine": dict.fromkeys(_TRANSFORMER_ENGINE, "drivetrain-fp8"),
    "accelerate.utils.ao": dict.fromkeys(_AO, "drivetrain-fp8"),
    "accelerate.utils.bnb": dict.fromkeys(_BNB, QUANTIZATION_DISTRIBUTION),
    "accelerate.utils.torch_xla": {"install_xla": "drivetrain-xla"},
    "accelerate.utils.launch": {
        **dict.fromkeys(_SAGEMAKER_LAUNCH, SAGEMAKER_DISTRIBUTION),
        "prepare_deepspeed_cmd_env": "drivetrain-deepspeed",
        "prepare_tpu": "drivetrain-xla",
        "setup_fp8_env": "drivetrain-fp8",
    },
    "accelerate.utils.modeling": {
        name: "drivetrain-offload" for name in ("align_module_device", "has_offloaded_params")
    },
    "accelerate.utils.operations": {"GatheredParameters": "drivetrain-deepspeed"},
    "accelerate.utils.other": {
        "compile_regions_deepspeed": "drivetrain-deepspeed",
        "compile_regions_fsdp2": "drivetrain-fsdp",
    },
    "accelerate.utils.dataclasses": {
        **dict.fromkeys(_DDP, "drivetrain-ddp"),
        **dict.fromkeys(_DEEPSPEED_CONFIG, "drivetrain-deepspeed"),
        "FullyShardedDataParallelPlugin": "drivetrain-fsdp",
        **dict.fromkeys(_FP8_CONFIG.split(), "drivetrain-fp8"),
        **dict.fromkeys(_MEGATRON_CONFIG, "drivetrain-megatron"),
        "BnbQuantizationConfig": QUANTIZATION_DISTRIBUTION,
    },
    "accelerate.utils": {
        **dict.fromkeys(_DDP, "drivetrain-ddp"),
        **dict.fromkeys(_DEEPSPEED_CONFIG, "drivetrain-deepspeed"),
        **dict.fromkeys(
            [*_DEEPSPEED_UTILS, "GatheredParameters", "compile_regions_deepspeed"], "drivetrain-deepspeed"
        ),
        **dict.fromkeys([n for n in _FSDP_UTILS if n != "get_parameters_from_modules"], "drivetrain-fsdp"),
        "FullyShardedDataParallelPlugin": "drivetrain-fsdp",
        "compile_regions_fsdp2": "drivetrain-fsdp",
        **dict.fromkeys(
            [*_FP8_CONFIG.split()[:4], *_TRANSFORMER_ENGINE, *_AO[:2], "has_ao_layers"], "drivetrain-fp8"
        ),
        **dict.fromkeys(
            [
                *_MEGATRON_UTILS[:11],
                "gather_across_data_parallel_groups",
                *_MEGATRON_IN_UTILS,
                "MegatronLMPlugin",
                "add_model_config_to_megatron_parser",
            ],
            "drivetrain-megatron",
        ),
        **dict.fromkeys(
            ["BnbQuantizationConfig", "has_4bit_bnb_layers", "load_and_quantize_model"],
            QUANTIZATION_DISTRIBUTION,
        ),
        "align_module_device": "drivetrain-offload",
        "has_offloaded_params": "drivetrain-offload",
        "install_xla": "drivetrain-xla",
        "prepare_tpu": "drivetrain-xla",
        "prepare_deepspeed_cmd_env": "drivetrain-deepspeed",
        "prepare_sagemager_args_inputs": SAGEMAKER_DISTRIBUTION,
    },
    "accelerate.commands.to_fsdp2": dict.fromkeys(
        "ARGUMENT_KEY_MAPPING ARGUMENT_VALUE_MAPPING ConversionStatus convert_config_to_fsdp2 to_fsdp2_command "
        "to_fsdp2_command_parser main load_config logger".split(),
        "drivetrain-fsdp",
    ),
    "accelerate.commands.tpu": dict.fromkeys(
        ["tpu_command_launcher", "tpu_command_parser", "main"], "drivetrain-xla"
    ),
    "accelerate.commands.config.sagemaker": {"get_sagemaker_input": SAGEMAKER_DISTRIBUTION},
    "accelerate.commands.launch": {
        "deepspeed_launcher": "drivetrain-deepspeed",
        "tpu_launcher": "drivetrain-xla",
        "tpu_pod_launcher": "drivetrain-xla",
        "sagemaker_launcher": SAGEMAKER_DISTRIBUTION,
    },
}

#: Table value for a module's ``logger`` (Accelerate's modules each have one): drivetrain's logger of that name.
LOGGER = "@logger"

#: ``drivetrain.data``'s loaders and samplers, which ``accelerate.data_loader`` holds.
_DATA_LOADING = (
    "BatchSamplerShard DataLoaderDispatcher DataLoaderShard IterableDatasetShard SeedableRandomSampler "
    "SkipBatchSampler SkipDataLoader prepare_data_loader skip_first_batches"
).split()

#: drivetrain's own checkpoint names that ``drivetrain.checkpointing`` serves besides Accelerate's (scripts and
#: docs/checkpointing.md use them), each where it lives in drivetrain.checkpoint.
_CHECKPOINT_NAMES = {
    **dict.fromkeys(
        ["CHECKPOINTS_FOLDER", "Checkpointer", "clean_state_dict_for_safetensors", "save"],
        "drivetrain.checkpoint.checkpointer",
    ),
    **dict.fromkeys(["atomic_write", "sha256_of_file"], "drivetrain.checkpoint.files"),
    **dict.fromkeys(
        ["MANIFEST_NAME", "is_complete", "read_manifest", "verify"], "drivetrain.checkpoint.manifest"
    ),
    "verify_checkpoint": "drivetrain.checkpoint.manifest:verify",  # an older name of verify, kept for scripts
    "write_model_files": "drivetrain.checkpoint.model_files",
    "complete_checkpoints": "drivetrain.checkpoint.rotation",
    **dict.fromkeys(
        [
            "UNSAFE_OPT_OUT",
            "deduplicate_shared",
            "load_safetensors_into_module",
            "safe_load",
            "save_safetensors",
        ],
        "drivetrain.checkpoint.serialization",
    ),
    **dict.fromkeys(
        ["read_training_objects", "write_model_weights", "write_training_objects"],
        "drivetrain.checkpoint.training_objects",
    ),
}

#: Accelerate's module paths that have no file in drivetrain: each is made, when imported, from its table here
#: (name -> ``"module"`` holding the same name, or ``"module:attribute"``; see drivetrain.contract.reexport).
#: The names listed above for the same path (kernel names that spell a backend, plugin names) are merged in.
_ROOT_MODULES: dict[str, dict[str, str]] = {
    "drivetrain.parallelism_config": {"ParallelismConfig": "drivetrain.config.parallelism"},
    "drivetrain.scheduler": {"AcceleratedScheduler": "drivetrain.training.scheduler"},
    "drivetrain.inference": {},
    "drivetrain.local_sgd": {},
    # module hooks (run around a module's forward, for offloading), not plugin hooks: the offload plugin's
    "drivetrain.hooks": {},
    "drivetrain.checkpointing": {
        **_CHECKPOINT_NAMES,
        **dict.fromkeys(
            ["save_custom_state", "load_custom_state"], "drivetrain.compat.accelerate_api.checkpointing"
        ),
        "logger": LOGGER,
    },
    "drivetrain.data_loader": {
        **dict.fromkeys(_DATA_LOADING, "drivetrain.data"),
        **dict.fromkeys(
            ["DataLoaderStateMixin", "DataLoaderAdapter", "get_sampler"],
            "drivetrain.compat.accelerate_api.data_loader",
        ),
        "logger": LOGGER,
    },
    "drivetrain.optimizer": {
        "AcceleratedOptimizer": "drivetrain.training.optimizer",
        **dict.fromkeys(
            ["move_to_device", "patch_optimizer_step"], "drivetrain.compat.accelerate_api.optimizer"
        ),
    },
    "drivetrain.launchers": {
        **dict.fromkeys(["notebook_launcher", "debug_launcher"], "drivetrain.launching.forked"),
        "test_launch": "drivetrain.compat.accelerate_api.launchers",
    },
    # holds nothing: ON_IMPORT warns
    "drivetrain.memory_utils": {},
}


def _at(module: str, names: str) -> dict[str, str]:
    """``{name: module}`` for each of the space-separated ``names``."""
    return dict.fromkeys(names.split(), module)


#: Accelerate's checks of libraries that are not backends (``drivetrain.utils.imports``; those that name a backend
#: are in compat.availability and merged in through KERNEL_NAMES_BY_PATH).
_LIBRARY_CHECKS = (
    "is_4bit_bnb_available is_8bit_bnb_available is_aim_available is_amdsmi_available is_bf16_available "
    "is_bnb_available is_boto3_available is_clearml_available is_comet_ml_available is_cuda_available "
    "is_datasets_available is_dvclive_available is_fp16_available is_import_timer_available is_lomo_available "
    "is_matplotlib_available is_mlflow_available is_pandas_available is_peft_available is_pippy_available "
    "is_pynvml_available is_pytest_available is_rich_available is_rocm_available is_sagemaker_available "
    "is_schedulefree_available is_swanlab_available is_tensorboard_available is_timm_available "
    "is_torchdata_available is_torchdata_stateful_dataloader_available is_torchvision_available "
    "is_trackio_available is_transformers_available is_triton_available is_wandb_available "
    "is_weights_only_available is_xccl_available"
)
#: Accelerate's name of the check that ``prepare`` asks (drivetrain.training.admission answers it).
_QUANTIZATION_ON_CPU = {
    "is_bitsandbytes_multi_backend_available": "drivetrain.training.admission:quantization_computes_on_cpu"
}
_FILE_NAMES = (
    "MODEL_NAME OPTIMIZER_NAME RNG_STATE_NAME SAFE_WEIGHTS_INDEX_NAME SAFE_WEIGHTS_NAME SCALER_NAME SCHEDULER_NAME "
    "WEIGHTS_INDEX_NAME WEIGHTS_NAME"
)
_ENUMS = "ComputeEnvironment CustomDtype DistributedType DynamoBackend LoggerType PrecisionType RNGType SageMakerDistributedType"
_CONFIGURATIONS = "DataLoaderConfiguration GradientAccumulationPlugin ProjectConfiguration TorchDynamoPlugin"
_KWARGS_HANDLERS = "AutocastKwargs GradScalerKwargs InitProcessGroupKwargs KwargsHandler ProfileKwargs"
_PARALLELISM = (
    "ParallelismConfig TorchContextParallelConfig TorchTensorParallelConfig TorchTensorParallelPlugin"
)
_COLLECTIVES = (
    "DistributedOperationException broadcast broadcast_object_list concatenate convert_outputs_to_fp32 "
    "convert_to_fp32 copy_tensor_to_devices find_batch_size find_device gather gather_for_metrics gather_object "
    "get_data_structure honor_type ignorant_find_batch_size initialize_tensors is_namedtuple listify "
    "pad_across_processes recursively_apply reduce send_to_device slice_tensors"
)
_MEMORY = "find_executable_batch_size release_memory should_reduce_batch_size"
_RANDOM = "set_seed synchronize_rng_state synchronize_rng_states"
_OFFLOAD = (
    "OffloadedWeightsLoader PrefixedDataset extract_submodules_state_dict load_offloaded_weight offload_state_dict "
    "offload_weight save_offload_index"
)
_TENSOR_HELPERS = (
    "calculate_maximum_sizes check_tied_parameters_in_config check_tied_parameters_on_same_device "
    "convert_file_size_to_int dtype_byte_size get_grad_scaler get_max_layer_size get_mixed_precision_context_manager "
    "id_tensor_storage load_offloaded_weights load_state_dict named_module_tensors retie_parameters "
    "set_module_tensor_to_device"
)
_ENVIRONMENT_READERS = (
    "convert_dict_to_env_variables get_cpu_distributed_information get_int_from_env parse_choice_from_env "
    "parse_flag_from_env purge_accelerate_environment str_to_bool"
)
_MODULE_HELPERS = (
    "compile_regions get_model_tp_size get_module_children_bottom_up has_compiled_regions is_compiled_module "
    "model_has_dtensor"
)
_ACCELERATE_CONSTANTS = (
    "SAFE_MODEL_NAME SAMPLER_NAME PROFILE_PATTERN_NAME WEIGHTS_PATTERN_NAME SAFE_WEIGHTS_PATTERN_NAME "
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION TORCH_DISTRIBUTED_OPERATION_TYPES TORCH_LAUNCH_PARAMS"
)
_TEST_HELPERS = _at(_TESTING, "SubprocessCallException get_backend run_command")

#: ``drivetrain.utils`` and ``drivetrain.test_utils``, Accelerate's utility packages (their code, where it is not
#: the kernel's, is in drivetrain.compat.accelerate_api).
_UTILS_MODULES: dict[str, dict[str, str]] = {
    "drivetrain.utils": {
        **_at("drivetrain.constants", _FILE_NAMES),
        **_at(_CONSTANTS, _ACCELERATE_CONSTANTS),
        **_at("drivetrain.config.enums", _ENUMS),
        **_at("drivetrain.config.dataclasses", _CONFIGURATIONS),
        **_at("drivetrain.config.kwargs_handlers", _KWARGS_HANDLERS),
        **_at("drivetrain.config.parallelism", _PARALLELISM),
        "write_basic_config": "drivetrain.config.file",
        **_at("drivetrain.operations", f"{_COLLECTIVES} TensorInformation"),
        **_at("drivetrain.operations.nested", "is_tensor_information is_torch_tensor"),
        "CannotPadNestedTensorWarning": "drivetrain.operations.collective",
        **_at(_OPERATIONS, "pad_input_tensors wait_for_everyone"),
        **_at("drivetrain.operations.memory", _MEMORY),
        **_at("drivetrain.operations.random", _RANDOM),
        **_at("drivetrain.big_modeling.memmap_offload", _OFFLOAD),
        **_at("drivetrain.big_modeling.tensors", _TENSOR_HELPERS),
        **_at(
            "drivetrain.big_modeling",
            "check_device_map compute_module_sizes dispatch_model find_tied_parameters get_balanced_memory "
            "get_max_memory infer_auto_device_map init_empty_weights init_on_device load_checkpoint_and_dispatch "
            "load_checkpoint_in_model",
        ),
        **_at("drivetrain.checkpoint.checkpointer", "clean_state_dict_for_safetensors save"),
        **_at("drivetrain.tracking", "GeneralTracker on_main_process"),
        **_at("drivetrain.launching.forked", "debug_launcher notebook_launcher"),
        **_at("drivetrain.commands.launch", "prepare_multi_gpu_env prepare_simple_launcher_cmd_env"),
        "PrepareForLaunch": _LAUNCH_HELPERS,
        **_at("drivetrain.config.environment_variables", "clear_environment patch_environment"),
        "set_numa_affinity": "drivetrain.affinity",
        **_at(_ENVIRONMENT, _ENVIRONMENT_READERS),
        **_at(
            _MACHINE,
            "are_libraries_initialized check_cuda_p2p_ib_support check_os_kernel get_current_device_type "
            "get_gpu_info is_port_in_use",
        ),
        **_at(_MODULES, f"{_MODULE_HELPERS} is_peft_model"),
        **_at(_OBJECTS, "get_pretty_name merge_dicts recursive_getattr"),
        "load": _LOAD,
        "convert_bytes": "drivetrain.commands.estimate_memory",
        "extract_model_from_parallel": "drivetrain.training.modeling",
        "get_logger": "drivetrain.logging",
        "tqdm": "drivetrain.progress",
        **_at(_VERSIONS, "compare_versions is_torch_version"),
        **_at(_CHECKS, _LIBRARY_CHECKS),
        **_QUANTIZATION_ON_CPU,
    },
    "drivetrain.utils.ao": {},
    "drivetrain.utils.bnb": {"logger": LOGGER},
    "drivetrain.utils.constants": {
        **_at("drivetrain.constants", _FILE_NAMES),
        **_at(
            _CONSTANTS,
            f"{_ACCELERATE_CONSTANTS} SAGEMAKER_PYTORCH_VERSION SAGEMAKER_PYTHON_VERSION "
            "SAGEMAKER_TRANSFORMERS_VERSION SAGEMAKER_PARALLEL_EC2_INSTANCES DTENSOR_PYTORCH_VERSION "
            "TORCH_DYNAMO_MODES ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION BETA_TP_AVAILABLE_PYTORCH_VERSION "
            "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION BETA_CP_AVAILABLE_PYTORCH_VERSION STR_OPERATION_TO_FUNC "
            "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
        ),
    },
    "drivetrain.utils.dataclasses": {
        **_at("drivetrain.config.enums", f"{_ENUMS} BaseEnum EnumWithContains"),
        **_at("drivetrain.config.dataclasses", _CONFIGURATIONS),
        **_at("drivetrain.config.kwargs_handlers", _KWARGS_HANDLERS),
        **_at(
            "drivetrain.config.parallelism",
            "TorchContextParallelConfig TorchTensorParallelConfig TorchTensorParallelPlugin",
        ),
        "TensorInformation": "drivetrain.operations.nested",
        "get_module_class_from_name": _MODULES,
        "logger": LOGGER,
    },
    "drivetrain.utils.deepspeed": {},
    "drivetrain.utils.environment": {
        **_at(_ENVIRONMENT, f"{_ENVIRONMENT_READERS} CPUInformation logger"),
        **_at(
            _MACHINE,
            "are_libraries_initialized check_cuda_float8_capability check_cuda_p2p_ib_support "
            "get_current_device_type get_driver_version get_gpu_info",
        ),
        **_at("drivetrain.config.environment_variables", "clear_environment patch_environment"),
        **_at("drivetrain.affinity", "override_numa_affinity set_numa_affinity"),
    },
    "drivetrain.utils.fsdp_utils": {"logger": LOGGER},
    "drivetrain.utils.imports": {
        **_at(
            _CHECKS, f"{_LIBRARY_CHECKS} is_numpy_available is_torch_distributed_available is_tqdm_available"
        ),
        **_QUANTIZATION_ON_CPU,
        **_at(_VERSIONS, "compare_versions is_torch_version"),
        "str_to_bool": _ENVIRONMENT,
        **_at(_MACHINE, "get_free_port is_port_in_use"),
    },
    "drivetrain.utils.launch": {
        # _convert_nargs_to_dict: private, but Accelerate's own tests import it from this path
        **_at(_LAUNCH_HELPERS, "PrepareForLaunch env_var_path_add _convert_nargs_to_dict"),
        # drivetrain launch's own helpers (the launcher sits above this layer: resolved by name on first use)
        **_at("drivetrain.commands.launch", "prepare_multi_gpu_env prepare_simple_launcher_cmd_env"),
    },
    "drivetrain.utils.megatron_lm": {},
    "drivetrain.utils.memory": {
        **_at("drivetrain.operations.memory", _MEMORY),
        "clear_device_cache": f"{_API}.memory",
    },
    "drivetrain.utils.modeling": {
        **_at("drivetrain.big_modeling.tensors", _TENSOR_HELPERS),
        **_at(
            "drivetrain.big_modeling.tensors",
            "check_device_same clean_device_map compute_module_sizes compute_module_total_buffer_size "
            "get_module_leaves get_module_size_with_ties get_non_persistent_buffers get_state_dict_from_offload "
            "get_state_dict_offloaded_model",
        ),
        **_at(
            "drivetrain.big_modeling.device_map",
            "check_device_map find_tied_parameters infer_auto_device_map",
        ),
        **_at("drivetrain.big_modeling.sizes", "get_balanced_memory get_max_memory"),
        "load_checkpoint_in_model": "drivetrain.big_modeling.loading",
        "WEIGHTS_INDEX_NAME": "drivetrain.constants",
        "is_peft_model": _MODULES,
        "logger": LOGGER,
    },
    "drivetrain.utils.offload": _at("drivetrain.big_modeling.memmap_offload", _OFFLOAD),
    "drivetrain.utils.operations": {
        **_at("drivetrain.operations", _COLLECTIVES),
        **_at(
            "drivetrain.operations.nested",
            "ConvertOutputsToFp32 TensorInformation get_shape is_tensor_information is_torch_tensor",
        ),
        "CannotPadNestedTensorWarning": "drivetrain.operations.collective",
        **_at(
            _OPERATIONS,
            "TENSOR_INT_TO_DTYPE TENSOR_TYPE_TO_INT chained_operation gather_tensor_shape pad_input_tensors "
            "verify_operation",
        ),
    },
    "drivetrain.utils.other": {
        **_at(_MODULES, f"{_MODULE_HELPERS} has_repeated_blocks is_repeated_blocks"),
        **_at(_OBJECTS, "get_pretty_name merge_dicts recursive_getattr"),
        **_at(_LOAD, "load np_core TORCH_SAFE_GLOBALS"),
        **_at(_MACHINE, "check_os_kernel get_free_port is_port_in_use logger"),
        **_at("drivetrain.checkpoint.checkpointer", "clean_state_dict_for_safetensors save"),
        "convert_bytes": "drivetrain.commands.estimate_memory",
        "extract_model_from_parallel": "drivetrain.training.modeling",
        "wait_for_everyone": _OPERATIONS,
        "write_basic_config": "drivetrain.config.file",
    },
    "drivetrain.utils.random": _at("drivetrain.operations.random", _RANDOM),
    # Accelerate's module installs rich's traceback handler when imported: ON_IMPORT below
    "drivetrain.utils.rich": {},
    "drivetrain.utils.torch_xla": {},
    "drivetrain.utils.tqdm": {"tqdm": "drivetrain.progress"},
    "drivetrain.utils.transformer_engine": {},
    "drivetrain.utils.versions": _at(_VERSIONS, "OPERATIONS compare_versions is_torch_version torch_version"),
    "drivetrain.test_utils": _TEST_HELPERS,
    "drivetrain.test_utils.testing": _TEST_HELPERS,
}
#: drivetrain's own module paths (not Accelerate's) that have no file either, made the same way: kept for the
#: scripts and documents that use them.
OWN_MODULES: dict[str, dict[str, str]] = {
    # the test helpers plugins' tests use (docs/plugins/testing.md)
    "drivetrain.testing": dict.fromkeys(
        ["launch_script", "checks_reported_ok", "assert_checks_passed", "install_plugin_for_test"],
        "drivetrain.launching.testing",
    ),
    # ``python -m drivetrain.launch`` (RUN_AS_MAIN)
    "drivetrain.launch": {"main": "drivetrain.commands.launch"},
}
GENERATED_MODULES: dict[str, dict[str, str]] = {**_ROOT_MODULES, **_UTILS_MODULES, **OWN_MODULES}

#: Generated paths whose import does something in Accelerate: the module imported then (it warns, or installs
#: a handler).
ON_IMPORT: dict[str, str] = {
    "drivetrain.memory_utils": "drivetrain.compat.accelerate_api.memory_utils",
    "drivetrain.utils.rich": f"{_API}.rich_traceback",
}

#: Generated paths that ``python -m`` runs: path -> ``"module:function"``, whose result is the exit status.
RUN_AS_MAIN: dict[str, str] = {"drivetrain.launch": "drivetrain.commands.launch:main"}
