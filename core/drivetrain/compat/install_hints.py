"""Install hints: which distribution to install when a public name, a precision, a config section, a
distributed type, a launch flag or a config key belongs to a plugin that is not installed. Installed plugins
describe themselves; these tables only word the error."""

from drivetrain.compat.paths import PLUGIN_NAMES_BY_PATH

#: ``drivetrain`` and ``drivetrain.utils`` serve some plugin names wherever Accelerate has them (``from drivetrain
#: import LocalSGD``), each with the distribution :data:`~drivetrain.compat.paths.PLUGIN_NAMES_BY_PATH` gives it at
#: its Accelerate path: every name of these paths but the ones left out (names Accelerate added later, served only
#: at their own path so far: serving them there too would widen those two namespaces) ...
_SERVED_PATHS = {
    "accelerate": ("prepare_pippy",),
    "accelerate.hooks": ("CpuOffload", "LayerwiseCastingHook"),
    "accelerate.local_sgd": (),
    "accelerate.tracking": ("SwanLabTracker", "TrackioTracker"),
    "accelerate.utils.deepspeed": (),
    "accelerate.utils.fsdp_utils": ("ensure_weights_retied", "get_parameters_from_modules"),
    "accelerate.utils.modeling": (),
}

#: ... and these names of paths served in part: the configuration classes and Megatron-LM's training steps that a
#: script builds (not the machinery around them).
_SERVED_NAMES = {
    "accelerate.utils.dataclasses": (
        "MegatronLMPlugin FP8RecipeKwargs TERecipeKwargs AORecipeKwargs MSAMPRecipeKwargs".split()
    ),
    "accelerate.utils.megatron_lm": (
        "MegatronLMDummyDataLoader MegatronLMDummyScheduler AbstractTrainStep GPTTrainStep BertTrainStep "
        "T5TrainStep avg_losses_across_data_parallel_group"
    ).split(),
}

#: Plugin names at none of Accelerate's paths where a plugin answers: drivetrain's own (``XlaConfig``, the DeepSpeed
#: plugin's ``select_deepspeed_plugin`` and ``zero3_init``), and ``is_torch_xla_available``, which
#: ``drivetrain.utils`` answers from the kernel (an availability check, as Accelerate's) and ``drivetrain`` from the
#: XLA plugin.
_DRIVETRAIN_PLUGIN_NAMES = {
    "XlaConfig": "drivetrain-xla",
    "is_torch_xla_available": "drivetrain-xla",
    "select_deepspeed_plugin": "drivetrain-deepspeed",
    "zero3_init": "drivetrain-deepspeed",
}

#: Public name -> distribution that provides it: the plugin names ``drivetrain`` and ``drivetrain.utils`` serve
#: besides their own paths' (and the hint for the ImportError when the plugin is missing).
PLUGIN_EXPORTS = {
    **{
        name: distribution
        for path, left_out in _SERVED_PATHS.items()
        for name, distribution in PLUGIN_NAMES_BY_PATH[path].items()
        if name not in left_out
    },
    **{name: PLUGIN_NAMES_BY_PATH[path][name] for path, names in _SERVED_NAMES.items() for name in names},
    **_DRIVETRAIN_PLUGIN_NAMES,
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
