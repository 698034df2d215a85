"""``drivetrain launch --backend fsdp`` flags (Accelerate's names). Their values reach the processes in
DRIVETRAIN_BACKEND_CONFIG and are checked there by FullyShardedDataParallelPlugin."""

from __future__ import annotations

import argparse

#: flag -> help. Every flag takes one value; unset flags are not passed on.
FLAGS = {
    "fsdp_version": "2 (FSDP2, fully_shard; the default) or 1 (FullyShardedDataParallel)",
    "fsdp_sharding_strategy": "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2",
    "fsdp_reshard_after_forward": "true/false (FSDP2's name for FULL_SHARD vs SHARD_GRAD_OP)",
    "fsdp_hybrid_shard_size": "HYBRID_SHARD: processes per shard group (default: processes per machine)",
    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP",
    "fsdp_transformer_layer_cls_to_wrap": "comma-separated class names of the layers to shard as units",
    "fsdp_min_num_params": "SIZE_BASED_WRAP: smallest number of parameters of a unit",
    "fsdp_offload_params": "true/false: keep parameters, gradients and optimizer state on CPU",
    "fsdp_activation_checkpointing": "true/false: recompute each unit's activations in backward",
    "fsdp_activation_checkpointing_offload": "true/false: keep what checkpointed units save in host memory",
    "fsdp_cpu_ram_efficient_loading": "true/false: only rank 0 holds the loaded weights",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT or FULL_STATE_DICT (what save_state writes)",
    "fsdp_sync_module_states": "true/false: broadcast rank 0's weights when sharding",
    "fsdp_use_orig_params": "accepted for Accelerate configs; FSDP2 always keeps the original parameters",
    "fsdp_backward_prefetch": "BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH",
    "fsdp_forward_prefetch": "true/false: prefetch the next unit's parameters in forward",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, help_text in FLAGS.items():
        parser.add_argument(f"--{flag}", default=None, help=help_text)
