"""Accelerate's names that belong to backends, for scripts written for HuggingFace Accelerate.

This is the one file in the kernel that names backends (``tests/contract/test_architecture.py`` checks it): which
distribution to install for a public name, a precision or a multi-process run when the plugin providing it is
not installed, and which ``Accelerator`` keyword arguments are aliases of the generic ``backend_config``.
Installed plugins describe themselves (``PluginInfo``, the ``drivetrain.exports`` entry-point group); these
tables only word the error when one is missing, so adding a backend never requires editing them.
"""

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

#: Accelerate's distributed types of plain data parallelism, whose models torch's ``Join`` can shadow in
#: ``join_uneven_inputs`` (sharded or compiled engines run collectives Join does not know).
JOINABLE_DISTRIBUTED_TYPES = frozenset(
    {"MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_XPU", "MULTI_HPU", "MULTI_SDAA", "MULTI_MUSA"}
)

#: Public name -> distribution that provides it (used only to word the ImportError when it is missing).
PLUGIN_EXPORTS = {
    "DistributedDataParallelKwargs": "drivetrain-ddp",
    "DDPCommunicationHookType": "drivetrain-ddp",
    "LocalSGD": "drivetrain-ddp",
    "FullyShardedDataParallelPlugin": "drivetrain-fsdp",
    "merge_fsdp_weights": "drivetrain-fsdp",
    "enable_fsdp_ram_efficient_loading": "drivetrain-fsdp",
    "disable_fsdp_ram_efficient_loading": "drivetrain-fsdp",
    **{
        name: "drivetrain-fsdp"
        for name in (
            "save_fsdp_model",
            "load_fsdp_model",
            "save_fsdp_optimizer",
            "load_fsdp_optimizer",
            "fsdp2_prepare_model",
            "fsdp2_load_full_state_dict",
            "fsdp2_switch_optimizer_parameters",
            "fsdp2_apply_ac",
            "fsdp2_prepare_auto_wrap_policy",
            "fsdp2_canonicalize_names",
            "get_fsdp2_grad_scaler",
        )
    },
    "XlaConfig": "drivetrain-xla",
    "is_torch_xla_available": "drivetrain-xla",
    "DeepSpeedPlugin": "drivetrain-deepspeed",
    "DummyOptim": "drivetrain-deepspeed",
    "DummyScheduler": "drivetrain-deepspeed",
    "HfDeepSpeedConfig": "drivetrain-deepspeed",
    "DeepSpeedEngineWrapper": "drivetrain-deepspeed",
    "DeepSpeedOptimizerWrapper": "drivetrain-deepspeed",
    "DeepSpeedSchedulerWrapper": "drivetrain-deepspeed",
    "map_pytorch_optim_to_deepspeed": "drivetrain-deepspeed",
    "get_active_deepspeed_plugin": "drivetrain-deepspeed",
    "select_deepspeed_plugin": "drivetrain-deepspeed",
    "zero3_init": "drivetrain-deepspeed",
    **{
        name: "drivetrain-megatron"
        for name in (
            "MegatronLMPlugin",
            "MegatronLMDummyDataLoader",
            "MegatronLMDummyScheduler",
            "AbstractTrainStep",
            "GPTTrainStep",
            "BertTrainStep",
            "T5TrainStep",
            "avg_losses_across_data_parallel_group",
        )
    },
    "FP8RecipeKwargs": "drivetrain-fp8",
    "TERecipeKwargs": "drivetrain-fp8",
    "AORecipeKwargs": "drivetrain-fp8",
    "MSAMPRecipeKwargs": "drivetrain-fp8",
    **{name: "drivetrain-offload" for name in (*MODULE_HOOK_NAMES, *OFFLOAD_FUNCTION_NAMES)},
    "TensorBoardTracker": "drivetrain-trackers",
    "WandBTracker": "drivetrain-trackers",
    "MLflowTracker": "drivetrain-trackers",
    "AimTracker": "drivetrain-trackers",
    "DVCLiveTracker": "drivetrain-trackers",
    "CometMLTracker": "drivetrain-trackers",
    "ClearMLTracker": "drivetrain-trackers",
}

#: Accelerate's backend-specific Accelerator keyword arguments; each is an alias of ``backend_config=``.
BACKEND_CONFIG_KWARGS = ("deepspeed_plugin", "fsdp_plugin", "megatron_lm_plugin")

#: ``mixed_precision`` values that need a plugin -> the distribution providing it.
PRECISION_DISTRIBUTIONS = {"fp8": "drivetrain-fp8"}

#: Installed when a script runs in several processes and no installed backend handles that.
MULTIPROCESS_BACKEND_DISTRIBUTION = "drivetrain-ddp"

#: Sections of Accelerate's config file (``accelerate config`` writes several even when unused). The section
#: of the backend a file selects is read by that backend (``PluginInfo.config_section``); the others are
#: accepted and, without their plugin, left unread.
ACCELERATE_SECTIONS = {
    "deepspeed_config": "drivetrain-deepspeed",
    "fsdp_config": "drivetrain-fsdp",
    "megatron_lm_config": "drivetrain-megatron",
    "tp_config": "drivetrain-fsdp",
    "ipex_config": "drivetrain-ipex",
    "mpirun_config": "drivetrain-ipex",
    "fp8_config": "drivetrain-fp8",
    "dynamo_config": "drivetrain",
}

#: Accelerate's ``ParallelismConfig.sp_backend`` values (sequence parallelism run by a backend's own groups);
#: the first is the default, as in Accelerate.
SEQUENCE_PARALLEL_BACKENDS = ("deepspeed",)

#: Accelerate's ``distributed_type`` values answered by a backend plugin -> the distribution to install.
ACCELERATE_DISTRIBUTED_TYPES = {
    "DEEPSPEED": "drivetrain-deepspeed",
    "FSDP": "drivetrain-fsdp",
    "MEGATRON_LM": "drivetrain-megatron",
    "XLA": "drivetrain-xla",
    "TPU": "drivetrain-xla",
}

#: Accelerate's ``launch`` flags that select a backend -> the distribution to install. An installed backend
#: declares its flag (``PluginInfo.launch_flag``).
ACCELERATE_BACKEND_FLAGS = {
    "use_deepspeed": "drivetrain-deepspeed",
    "use_fsdp": "drivetrain-fsdp",
    "use_megatron_lm": "drivetrain-megatron",
    "tpu": "drivetrain-xla",
}

#: Top-level keys of Accelerate's config file that belong to a plugin (which claims them with
#: ``registry.add_config_keys``) -> the distribution that provides it.
ACCELERATE_PLUGIN_KEYS = {
    "main_training_function": "drivetrain-xla",
    "downcast_bf16": "drivetrain-xla",
    "tpu_env": "drivetrain-xla",
    "tpu_use_cluster": "drivetrain-xla",
    "tpu_use_sudo": "drivetrain-xla",
    "tpu_name": "drivetrain-xla",
    "tpu_zone": "drivetrain-xla",
    "commands": "drivetrain-xla",
    "command_file": "drivetrain-xla",
    "use_xpu": "drivetrain-ipex",
}

#: The distribution of Accelerate's offloading machinery (the ``dispatch_module`` hook) and of its built-in
#: experiment trackers, for the error when none is installed.
OFFLOAD_DISTRIBUTION = "drivetrain-offload"
TRACKERS_DISTRIBUTION = "drivetrain-trackers"

# ---------------------------------------------------------------------------------------------------------------
# Accelerate's module paths (``accelerate.utils.modeling`` -> ``drivetrain.utils.modeling``): the names of each
# path that spell a backend. The modules themselves (drivetrain/utils/*.py, ...) list the rest; see
# drivetrain/contract/reexport.py and docs/compat-coverage.md.

#: Accelerate's ``is_*_available`` checks, evaluated by drivetrain.utils.imports. Keys of a spec:
#: ``packages``: alternatives ``(import name, distribution or None, minimum version or None)``, any installed;
#: ``any_of``: other checks, any true; ``device``: ``(package imported first or None, torch attribute path)``
#: whose ``is_available()`` answers; ``env``: ``(variable, default)`` that must be true; ``torch``: minimum torch.
ACCELERATE_AVAILABILITY: dict[str, dict] = {
    "is_deepspeed_available": {"packages": [("deepspeed", None, None)]},
    "is_msamp_available": {"packages": [("msamp", "ms-amp", None)]},
    "is_transformer_engine_available": {
        "packages": [
            ("transformer_engine", "transformer-engine", None),
            ("intel_transformer_engine", "intel-transformer-engine", None),
        ]
    },
    "is_transformer_engine_mxfp8_available": {
        "packages": [("transformer_engine", "transformer-engine", "2.1")]
    },
    "is_torchao_available": {"packages": [("torchao", None, "0.6.1")]},
    "is_fp8_available": {
        "any_of": ["is_msamp_available", "is_transformer_engine_available", "is_torchao_available"]
    },
    "is_torch_xla_available": {"packages": [("torch_xla", None, None)], "env": ("USE_TORCH_XLA", "true")},
    "is_megatron_lm_available": {
        "packages": [("megatron", "megatron-core", "0.8.0")],
        "env": ("ACCELERATE_USE_MEGATRON_LM", "false"),
    },
    "is_mps_available": {"device": (None, "backends.mps"), "torch": "1.12"},
    "is_xpu_available": {"device": (None, "xpu"), "torch": "2.7"},
    "is_mlu_available": {"device": ("torch_mlu", "mlu")},
    "is_musa_available": {"device": ("torch_musa", "musa")},
    "is_npu_available": {"device": ("torch_npu", "npu")},
    "is_sdaa_available": {"device": ("torch_sdaa", "sdaa")},
    "is_hpu_available": {"device": ("habana_frameworks.torch", "hpu")},
    "is_habana_gaudi1": {"device": ("habana_frameworks.torch", "hpu"), "gaudi1": True},
    "is_neuron_available": {"device": ("torch_neuronx", "neuron")},
}
#: The library ``torchao_required`` asks for, and the distributed type ``deepspeed_required`` asks for.
ACCELERATE_LIBRARY_REQUIRED = "is_torchao_available"
ACCELERATE_BACKEND_REQUIRED = "DEEPSPEED"
#: ``get_current_device_type``: the first available of these devices, in Accelerate's order, else CUDA.
ACCELERATE_DEVICE_ORDER = (
    ("is_mlu_available", ("mlu", "MULTI_MLU")),
    ("is_sdaa_available", ("sdaa", "MULTI_SDAA")),
    ("is_musa_available", ("musa", "MULTI_MUSA")),
    ("is_npu_available", ("npu", "MULTI_NPU")),
    ("is_hpu_available", ("hpu", "MULTI_HPU")),
    ("is_xpu_available", ("xpu", "MULTI_XPU")),
    ("is_neuron_available", ("neuron", "MULTI_NEURON")),
)
#: Distributed types whose parameters are sharded: ``get_grad_scaler`` gives torch's sharded scaler there.
ACCELERATE_SHARDED_SCALER_TYPES = ("FSDP",)
#: The device beside which a multi-backend quantization library does not train modules offloaded to the CPU
#: (Accelerate's ``prepare_model`` asks ``is_xpu_available()``; drivetrain.training.admission).
QUANTIZED_CPU_EXCLUDED_DEVICE = "xpu"
#: Devices whose ``torch.<attribute>.is_bf16_supported()`` answers ``is_bf16_available`` when available.
ACCELERATE_BF16_DEVICES = (("is_mlu_available", "mlu"), ("is_xpu_available", "xpu"))
#: Mixed precisions whose autocast computes in bfloat16 (``get_mixed_precision_context_manager``).
ACCELERATE_BF16_AUTOCAST_PRECISIONS = ("bf16", "fp8")
#: torch's gradient scaler for sharded parameters (``get_grad_scaler``), as ``module:attribute``.
SHARDED_GRAD_SCALER = "torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler"
#: Accelerate reads this variable once at import (``USE_TORCH_XLA``): the XLA runtime is used unless it is false.
ACCELERATE_RUNTIME_FLAG = ("USE_TORCH_XLA", "true")
#: Accelerate's type aliases in ``utils.dataclasses`` (``typing.Literal`` values).
ACCELERATE_LITERALS = {
    "Backend": ("MSAMP", "TE"),
    "OptLevel": ("O1", "O2"),
    "ProfilerActivity": ("cpu", "xpu", "mtia", "cuda", "hpu"),
}
#: The check whose device does not support fp16 (``is_fp16_available`` is False there).
ACCELERATE_NO_FP16_DEVICE = "is_habana_gaudi1"

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

QUANTIZATION_DISTRIBUTION = "drivetrain-bnb"
PIPELINE_DISTRIBUTION = "drivetrain-pippy"
SAGEMAKER_DISTRIBUTION = "drivetrain-sagemaker"

#: Distributions named above that no one publishes yet, with what they would provide: a placeholder for one of
#: their names says that, rather than asking for a ``pip install`` of a package that does not exist.
UNPUBLISHED_DISTRIBUTIONS = {
    PIPELINE_DISTRIBUTION: "PiPPy pipeline-parallel inference",
    SAGEMAKER_DISTRIBUTION: "SageMaker launching",
}

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

#: Accelerate's ``ClusterConfig`` fields after ``BaseConfig``'s, in order: (name, default); a ``dict``/``list``
#: default means an empty one (``None`` in Accelerate's dataclass, filled in after construction).
ACCELERATE_CLUSTER_CONFIG_FIELDS = (
    ("num_processes", -1),
    ("machine_rank", 0),
    ("num_machines", 1),
    ("gpu_ids", None),
    ("main_process_ip", None),
    ("main_process_port", None),
    ("rdzv_backend", "static"),
    ("same_network", False),
    ("main_training_function", "main"),
    ("enable_cpu_affinity", False),
    ("fp8_config", dict),
    ("deepspeed_config", dict),
    ("fsdp_config", dict),
    ("parallelism_config", dict),
    ("megatron_lm_config", dict),
    ("mpirun_config", dict),
    ("downcast_bf16", False),
    ("tpu_name", None),
    ("tpu_zone", None),
    ("tpu_use_cluster", False),
    ("tpu_use_sudo", False),
    ("command_file", None),
    ("commands", None),
    ("tpu_vm", None),
    ("tpu_env", None),
    ("dynamo_config", dict),
)

#: Accelerate's ``launch`` option groups by the option that opens them (``commands.launch.options_to_group``).
ACCELERATE_LAUNCH_OPTION_GROUPS = {
    "multi_gpu": "Distributed GPUs",
    "tpu": "TPU",
    "use_deepspeed": "DeepSpeed Arguments",
    "use_fsdp": "FSDP Arguments",
    "use_megatron_lm": "Megatron-LM Arguments",
    "fp8_backend": "FP8 Arguments",
}
#: An option spelled with this inside is Accelerate's ``--fp8_backend`` (its ``clean_option``).
ACCELERATE_PRECISION_BACKEND_OPTION = "fp8_backend"

#: The plugin function ``merge-weights`` runs (Accelerate's ``merge_command``): merging a sharded checkpoint.
ACCELERATE_MERGE_FUNCTION = "merge_fsdp_weights"
#: Accelerate's commands that a plugin provides: command -> (distribution, module of drivetrain.commands with
#: Accelerate's names, the options Accelerate's parser takes: (flag, takes a value, repeatable)). Without the
#: plugin, ``drivetrain <command>`` accepts those options and says, in one line, what to install.
ACCELERATE_PLUGIN_COMMANDS = {
    "to-fsdp2": (
        "drivetrain-fsdp",
        "Convert an FSDP1 config file to FSDP2.",
        (("--config_file", True, False), ("--output_file", True, False), ("--overwrite", False, False)),
    ),
    "tpu-config": (
        "drivetrain-xla",
        "Run commands on every worker of a TPU pod (e.g. install packages).",
        (
            ("--config_file", True, False),
            ("--tpu_name", True, False),
            ("--tpu_zone", True, False),
            ("--use_alpha", False, False),
            ("--command_file", True, False),
            ("--command", True, True),
            ("--install_accelerate", False, False),
            ("--accelerate_version", True, False),
            ("--debug", False, False),
        ),
    ),
}

#: Accelerate's ``launch`` options that belong to a plugin with none of the installed plugins declaring them:
#: (spellings, dest, takes a value, distribution). ``drivetrain launch`` accepts them, and refuses a run that sets
#: one in one line naming the distribution that reads it.
ACCELERATE_LAUNCH_PLUGIN_OPTIONS = (
    (("--tpu-cluster", "--tpu_cluster"), "tpu_use_cluster", False, "drivetrain-xla"),
    (("--no-tpu-cluster", "--no_tpu_cluster"), "tpu_use_cluster", False, "drivetrain-xla"),
    (("--tpu-use-sudo", "--tpu_use_sudo"), "tpu_use_sudo", False, "drivetrain-xla"),
    (("--vm",), "vm", True, "drivetrain-xla"),
    (
        ("--main-training-function", "--main_training_function"),
        "main_training_function",
        True,
        "drivetrain-xla",
    ),
    (("--downcast-bf16", "--downcast_bf16"), "downcast_bf16", False, "drivetrain-xla"),
    (
        ("--megatron-lm-tp-degree", "--megatron_lm_tp_degree"),
        "megatron_lm_tp_degree",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-use-custom-fsdp", "--megatron_lm_use_custom_fsdp"),
        "megatron_lm_use_custom_fsdp",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-no-load-optim", "--megatron_lm_no_load_optim"),
        "megatron_lm_no_load_optim",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-eod-mask-loss", "--megatron_lm_eod_mask_loss"),
        "megatron_lm_eod_mask_loss",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-overlap-cpu-optimizer-d2h-h2d", "--megatron_lm_overlap_cpu_optimizer_d2h_h2d"),
        "megatron_lm_overlap_cpu_optimizer_d2h_h2d",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-no-save-optim", "--megatron_lm_no_save_optim"),
        "megatron_lm_no_save_optim",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-optimizer-cpu-offload", "--megatron_lm_optimizer_cpu_offload"),
        "megatron_lm_optimizer_cpu_offload",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-use-precision-aware-optimizer", "--megatron_lm_use_precision_aware_optimizer"),
        "megatron_lm_use_precision_aware_optimizer",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-decoder-last-pipeline-num-layers", "--megatron_lm_decoder_last_pipeline_num_layers"),
        "megatron_lm_decoder_last_pipeline_num_layers",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-pp-degree", "--megatron_lm_pp_degree"),
        "megatron_lm_pp_degree",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-num-micro-batches", "--megatron_lm_num_micro_batches"),
        "megatron_lm_num_micro_batches",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-sequence-parallelism", "--megatron_lm_sequence_parallelism"),
        "megatron_lm_sequence_parallelism",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-recompute-activations", "--megatron_lm_recompute_activations"),
        "megatron_lm_recompute_activations",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-use-distributed-optimizer", "--megatron_lm_use_distributed_optimizer"),
        "megatron_lm_use_distributed_optimizer",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-gradient-clipping", "--megatron_lm_gradient_clipping"),
        "megatron_lm_gradient_clipping",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-recompute-granularity", "--megatron_lm_recompute_granularity"),
        "megatron_lm_recompute_granularity",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-recompute-method", "--megatron_lm_recompute_method"),
        "megatron_lm_recompute_method",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-recompute-num-layers", "--megatron_lm_recompute_num_layers"),
        "megatron_lm_recompute_num_layers",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-attention-backend", "--megatron_lm_attention_backend"),
        "megatron_lm_attention_backend",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-expert-model-parallel-size", "--megatron_lm_expert_model_parallel_size"),
        "megatron_lm_expert_model_parallel_size",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-context-parallel-size", "--megatron_lm_context_parallel_size"),
        "megatron_lm_context_parallel_size",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-attention-dropout", "--megatron_lm_attention_dropout"),
        "megatron_lm_attention_dropout",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-hidden-dropout", "--megatron_lm_hidden_dropout"),
        "megatron_lm_hidden_dropout",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-attention-softmax-in-fp32", "--megatron_lm_attention_softmax_in_fp32"),
        "megatron_lm_attention_softmax_in_fp32",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-expert-tensor-parallel-size", "--megatron_lm_expert_tensor_parallel_size"),
        "megatron_lm_expert_tensor_parallel_size",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-calculate-per-token-loss", "--megatron_lm_calculate_per_token_loss"),
        "megatron_lm_calculate_per_token_loss",
        True,
        "drivetrain-megatron",
    ),
    (
        ("--megatron-lm-use-rotary-position-embeddings", "--megatron_lm_use_rotary_position_embeddings"),
        "megatron_lm_use_rotary_position_embeddings",
        True,
        "drivetrain-megatron",
    ),
    (("--aws-access-key-id", "--aws_access_key_id"), "aws_access_key_id", True, SAGEMAKER_DISTRIBUTION),
    (
        ("--aws-secret-access-key", "--aws_secret_access_key"),
        "aws_secret_access_key",
        True,
        SAGEMAKER_DISTRIBUTION,
    ),
    (("--mpirun-hostfile", "--mpirun_hostfile"), "mpirun_hostfile", True, "drivetrain-ipex"),
    (
        ("--parallelism-config-sp-seq-length", "--parallelism_config_sp_seq_length"),
        "parallelism_config_sp_seq_length",
        True,
        "drivetrain-deepspeed",
    ),
    (
        ("--parallelism-config-sp-seq-length-is-variable", "--parallelism_config_sp_seq_length_is_variable"),
        "parallelism_config_sp_seq_length_is_variable",
        True,
        "drivetrain-deepspeed",
    ),
    (
        ("--parallelism-config-sp-attn-implementation", "--parallelism_config_sp_attn_implementation"),
        "parallelism_config_sp_attn_implementation",
        True,
        "drivetrain-deepspeed",
    ),
)
