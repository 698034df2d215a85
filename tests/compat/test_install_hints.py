"""``install_hints.PLUGIN_EXPORTS`` is derived from ``paths.PLUGIN_NAMES_BY_PATH``: the same names, each with the
distribution it had when it was a table of its own (written out below as it was at fe0dd1f)."""

from __future__ import annotations

from drivetrain.compat import install_hints, paths

#: PLUGIN_EXPORTS as it was written by hand: distribution -> names.
WRITTEN_BY_HAND = {
    "drivetrain-ddp": "DistributedDataParallelKwargs DDPCommunicationHookType LocalSGD",
    "drivetrain-fsdp": (
        "FullyShardedDataParallelPlugin merge_fsdp_weights enable_fsdp_ram_efficient_loading "
        "disable_fsdp_ram_efficient_loading save_fsdp_model load_fsdp_model save_fsdp_optimizer load_fsdp_optimizer "
        "fsdp2_prepare_model fsdp2_load_full_state_dict fsdp2_switch_optimizer_parameters fsdp2_apply_ac "
        "fsdp2_prepare_auto_wrap_policy fsdp2_canonicalize_names get_fsdp2_grad_scaler"
    ),
    "drivetrain-xla": "XlaConfig is_torch_xla_available",
    "drivetrain-deepspeed": (
        "DeepSpeedPlugin DummyOptim DummyScheduler HfDeepSpeedConfig DeepSpeedEngineWrapper DeepSpeedOptimizerWrapper "
        "DeepSpeedSchedulerWrapper map_pytorch_optim_to_deepspeed get_active_deepspeed_plugin select_deepspeed_plugin "
        "zero3_init"
    ),
    "drivetrain-megatron": (
        "MegatronLMPlugin MegatronLMDummyDataLoader MegatronLMDummyScheduler AbstractTrainStep GPTTrainStep "
        "BertTrainStep T5TrainStep avg_losses_across_data_parallel_group"
    ),
    "drivetrain-fp8": "FP8RecipeKwargs TERecipeKwargs AORecipeKwargs MSAMPRecipeKwargs",
    "drivetrain-offload": (
        "ModelHook SequentialHook AlignDevicesHook UserCpuOffloadHook add_hook_to_module remove_hook_from_module "
        "remove_hook_from_submodules attach_align_device_hook attach_align_device_hook_on_blocks "
        "attach_execution_device_hook cpu_offload cpu_offload_with_hook disk_offload has_offloaded_params "
        "align_module_device"
    ),
    "drivetrain-trackers": (
        "TensorBoardTracker WandBTracker MLflowTracker AimTracker DVCLiveTracker CometMLTracker ClearMLTracker"
    ),
}


def test_every_plugin_export_has_the_distribution_it_had():
    before = {name: distribution for distribution, names in WRITTEN_BY_HAND.items() for name in names.split()}
    assert len(before) == 65
    assert install_hints.PLUGIN_EXPORTS == before


def test_plugin_exports_agree_with_the_paths_table():
    """A name at one of Accelerate's paths has the distribution the paths table gives it there; only the few
    names no path holds are written in install_hints."""
    at_paths: dict[str, set[str]] = {}
    for table in paths.PLUGIN_NAMES_BY_PATH.values():
        for name, distribution in table.items():
            at_paths.setdefault(name, set()).add(distribution)
    elsewhere = {name for name in install_hints.PLUGIN_EXPORTS if name not in at_paths}
    assert elsewhere == set(install_hints._DRIVETRAIN_PLUGIN_NAMES)
    for name, distribution in install_hints.PLUGIN_EXPORTS.items():
        assert at_paths.get(name, {distribution}) == {distribution}, name
