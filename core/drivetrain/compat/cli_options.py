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
