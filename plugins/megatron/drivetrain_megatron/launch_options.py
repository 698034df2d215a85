"""``drivetrain launch --backend megatron`` flags (Accelerate's ``--megatron_lm_*`` names). Their values reach
the processes in DRIVETRAIN_BACKEND_CONFIG and are checked there by MegatronLMPlugin."""

from __future__ import annotations

import argparse

#: flag -> help. Every flag takes one value; unset flags are not passed on.
FLAGS = {
    "megatron_lm_tp_degree": "tensor parallelism degree",
    "megatron_lm_pp_degree": "pipeline parallelism degree (needs CUDA)",
    "megatron_lm_num_micro_batches": "number of micro-batches when pp_degree > 1",
    "megatron_lm_sequence_parallelism": "true/false: sequence parallelism when tp_degree > 1",
    "megatron_lm_recompute_activations": "true/false: selective activation recomputation",
    "megatron_lm_use_distributed_optimizer": "true/false: shard optimizer state over the data-parallel group",
    "megatron_lm_gradient_clipping": "clip gradients to this global L2 norm (0 to disable)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, help_text in FLAGS.items():
        parser.add_argument(f"--{flag}", default=None, help=help_text)
