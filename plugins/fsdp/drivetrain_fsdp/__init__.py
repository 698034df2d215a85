"""drivetrain-fsdp: the Fully Sharded Data Parallel backend, built on FSDP2 (``fully_shard``)."""
