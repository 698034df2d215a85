"""Names kept for scripts written for HuggingFace Accelerate.

This is the one place in the kernel that knows backend names: which distribution provides a public
name that scripts import from ``drivetrain`` or ``drivetrain.utils``, and which ``Accelerator`` keyword
arguments are aliases of the generic ``backend_config``. Adding a backend never requires editing it: a new
plugin declares its exports through the ``drivetrain.exports`` entry-point group.
"""

#: Public name -> distribution that provides it (used only to word the ImportError when it is missing).
PLUGIN_EXPORTS = {
    "DistributedDataParallelKwargs": "drivetrain-ddp",
    "DDPCommunicationHookType": "drivetrain-ddp",
    "LocalSGD": "drivetrain-ddp",
    "FullyShardedDataParallelPlugin": "drivetrain-fsdp",
    "merge_fsdp_weights": "drivetrain-fsdp",
    "enable_fsdp_ram_efficient_loading": "drivetrain-fsdp",
    "disable_fsdp_ram_efficient_loading": "drivetrain-fsdp",
    "DeepSpeedPlugin": "drivetrain-deepspeed",
    "DummyOptim": "drivetrain-deepspeed",
    "DummyScheduler": "drivetrain-deepspeed",
    "HfDeepSpeedConfig": "drivetrain-deepspeed",
    "get_active_deepspeed_plugin": "drivetrain-deepspeed",
    "select_deepspeed_plugin": "drivetrain-deepspeed",
    "zero3_init": "drivetrain-deepspeed",
    "MegatronLMPlugin": "drivetrain-megatron",
    "FP8RecipeKwargs": "drivetrain-fp8",
    "TERecipeKwargs": "drivetrain-fp8",
    "AORecipeKwargs": "drivetrain-fp8",
    "MSAMPRecipeKwargs": "drivetrain-fp8",
    "cpu_offload": "drivetrain-offload",
    "cpu_offload_with_hook": "drivetrain-offload",
    "disk_offload": "drivetrain-offload",
    "ModelHook": "drivetrain-offload",
    "SequentialHook": "drivetrain-offload",
    "AlignDevicesHook": "drivetrain-offload",
    "UserCpuOffloadHook": "drivetrain-offload",
    "add_hook_to_module": "drivetrain-offload",
    "remove_hook_from_module": "drivetrain-offload",
    "remove_hook_from_submodules": "drivetrain-offload",
    "attach_align_device_hook": "drivetrain-offload",
    "attach_align_device_hook_on_blocks": "drivetrain-offload",
    "attach_execution_device_hook": "drivetrain-offload",
    "has_offloaded_params": "drivetrain-offload",
    "align_module_device": "drivetrain-offload",
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
