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

#: Names of Accelerate's paths implemented by the kernel whose names spell a backend: path -> name -> target.
KERNEL_NAMES_BY_PATH: dict[str, dict[str, str]] = {
    "accelerate.utils.imports": {
        **{name: "drivetrain.utils.imports" for name in ACCELERATE_AVAILABILITY},
        "torchao_required": "drivetrain.utils.imports:library_required",
        "deepspeed_required": "drivetrain.utils.imports:backend_required",
        "USE_TORCH_XLA": "drivetrain.utils.imports:use_accelerator_runtime",
    },
    "accelerate.utils.constants": {
        name: "drivetrain.utils.constants" for name in ACCELERATE_BACKEND_CONSTANTS
    },
    "accelerate.utils": {
        **{name: "drivetrain.utils.imports" for name in ACCELERATE_AVAILABILITY},
        "torchao_required": "drivetrain.utils.imports:library_required",
        "deepspeed_required": "drivetrain.utils.imports:backend_required",
        "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION": "drivetrain.utils.constants",
        "check_cuda_fp8_capability": "drivetrain.utils.environment:check_cuda_float8_capability",
    },
    "accelerate.utils.dataclasses": {name: "drivetrain.utils.dataclasses" for name in ACCELERATE_LITERALS},
    "accelerate.utils.environment": {
        "check_cuda_fp8_capability": "drivetrain.utils.environment:check_cuda_float8_capability"
    },
    "accelerate.utils.operations": {
        "is_torch_xpu_tensor": "drivetrain.utils.operations:is_accelerator_tensor"
    },
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
#: ``drivetrain.utils`` and ``drivetrain.test_utils``, Accelerate's utility packages.
_UTILS_MODULES: dict[str, dict[str, str]] = {}
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
    # drivetrain.utils' tables still name this path for patch_environment and clear_environment: drop it when
    # they name drivetrain.config.environment_variables
    "drivetrain.environment": dict.fromkeys(
        ["patch_environment", "clear_environment"], "drivetrain.config.environment_variables"
    ),
}
GENERATED_MODULES: dict[str, dict[str, str]] = {**_ROOT_MODULES, **_UTILS_MODULES, **OWN_MODULES}

#: Generated paths whose import does something in Accelerate: the module imported then (it warns, or installs
#: a handler).
ON_IMPORT: dict[str, str] = {"drivetrain.memory_utils": "drivetrain.compat.accelerate_api.memory_utils"}

#: Generated paths that ``python -m`` runs: path -> ``"module:function"``, whose result is the exit status.
RUN_AS_MAIN: dict[str, str] = {"drivetrain.launch": "drivetrain.commands.launch:main"}
