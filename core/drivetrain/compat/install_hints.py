"""Install hints: which distribution to install when a public name, a precision, a config section, a
distributed type, a launch flag or a config key belongs to a plugin that is not installed. Installed plugins
describe themselves; these tables only word the error."""

from drivetrain.compat.paths import MODULE_HOOK_NAMES, OFFLOAD_FUNCTION_NAMES

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

#: ``mixed_precision`` values that need a plugin -> the distribution providing it.
PRECISION_DISTRIBUTIONS = {"fp8": "drivetrain-fp8"}

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
