"""Accelerate's command-line surface that belongs to plugins: config-file fields, launch option groups, plugin
commands and launch options, so that ``drivetrain launch``/``config`` accept them without the plugin and say
what to install."""

from drivetrain.compat.distributions import SAGEMAKER_DISTRIBUTION

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


def _options(spec: str) -> tuple[tuple[str, bool, bool], ...]:
    """``"config_file= command=* debug"`` -> ``(("config_file", True, False), ("command", True, True),
    ("debug", False, False))``: (name, takes a value, repeatable), spelled as :mod:`getopt` spells long options
    (``name`` a flag, ``name=`` takes a value, ``name=*`` takes one each time it is given)."""
    return tuple((word.split("=")[0], "=" in word, word.endswith("=*")) for word in spec.split())


def _command_options(spec: str) -> tuple[tuple[str, bool, bool], ...]:
    """:func:`_options` with each name as its flag, ``--name``."""
    return tuple(("--" + name, takes_value, repeatable) for name, takes_value, repeatable in _options(spec))


#: Accelerate's commands that a plugin provides: command -> (distribution, help, the options Accelerate's parser
#: takes: (flag, takes a value, repeatable)). Without the plugin, ``drivetrain <command>`` accepts those options
#: (each also in its ``--kebab-case`` spelling) and says, in one line, what to install.
ACCELERATE_PLUGIN_COMMANDS = {
    "to-fsdp2": (
        "drivetrain-fsdp",
        "Convert an FSDP1 config file to FSDP2.",
        _command_options("config_file= output_file= overwrite"),
    ),
    "tpu-config": (
        "drivetrain-xla",
        "Run commands on every worker of a TPU pod (e.g. install packages).",
        _command_options(
            "config_file= tpu_name= tpu_zone= use_alpha command_file= command=* install_accelerate "
            "accelerate_version= debug"
        ),
    ),
}


def _spellings(name: str) -> tuple[str, ...]:
    """``tpu_use_sudo`` -> ``("--tpu-use-sudo", "--tpu_use_sudo")``: Accelerate spells each of its launch options
    both ways (once when the two are the same: ``--vm``)."""
    kebab, snake = "--" + name.replace("_", "-"), "--" + name
    return (kebab,) if kebab == snake else (kebab, snake)


#: Accelerate's ``launch`` options that belong to a plugin, by the distribution that reads them, in Accelerate's
#: order: ``name`` is the flag ``--name`` (set or not), ``name=`` takes a value; each is spelled ``--a-b`` and
#: ``--a_b`` and sets ``args.<name>``, except as :data:`_DESTINATION_OF` says.
_PLUGIN_LAUNCH_OPTIONS = {
    "drivetrain-xla": "tpu_cluster no_tpu_cluster tpu_use_sudo vm= main_training_function= downcast_bf16",
    "drivetrain-megatron": " ".join(
        f"megatron_lm_{name}="
        for name in (
            "tp_degree use_custom_fsdp no_load_optim eod_mask_loss overlap_cpu_optimizer_d2h_h2d no_save_optim "
            "optimizer_cpu_offload use_precision_aware_optimizer decoder_last_pipeline_num_layers pp_degree "
            "num_micro_batches sequence_parallelism recompute_activations use_distributed_optimizer "
            "gradient_clipping recompute_granularity recompute_method recompute_num_layers attention_backend "
            "expert_model_parallel_size context_parallel_size attention_dropout hidden_dropout "
            "attention_softmax_in_fp32 expert_tensor_parallel_size calculate_per_token_loss "
            "use_rotary_position_embeddings"
        ).split()
    ),
    SAGEMAKER_DISTRIBUTION: "aws_access_key_id= aws_secret_access_key=",
    "drivetrain-ipex": "mpirun_hostfile=",
    "drivetrain-deepspeed": (
        "parallelism_config_sp_seq_length= parallelism_config_sp_seq_length_is_variable= "
        "parallelism_config_sp_attn_implementation="
    ),
}

#: The options whose ``dest`` is not their name: Accelerate's ``--tpu-cluster``/``--no-tpu-cluster`` pair sets
#: one setting (the ``--no`` spelling clears it).
_DESTINATION_OF = {"tpu_cluster": "tpu_use_cluster", "no_tpu_cluster": "tpu_use_cluster"}

#: Accelerate's ``launch`` options that belong to a plugin with none of the installed plugins declaring them:
#: (spellings, dest, takes a value, distribution). ``drivetrain launch`` accepts them, and refuses a run that sets
#: one in one line naming the distribution that reads it.
ACCELERATE_LAUNCH_PLUGIN_OPTIONS = tuple(
    (_spellings(name), _DESTINATION_OF.get(name, name), takes_value, distribution)
    for distribution, spec in _PLUGIN_LAUNCH_OPTIONS.items()
    for name, takes_value, _ in _options(spec)
)
