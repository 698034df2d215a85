"""drivetrain-megatron: tensor, sequence and pipeline parallelism on megatron-core."""
