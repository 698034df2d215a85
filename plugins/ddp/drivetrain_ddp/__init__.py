"""drivetrain-ddp: the DistributedDataParallel backend."""
