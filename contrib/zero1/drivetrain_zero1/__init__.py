"""drivetrain backend: DDP with ZeroRedundancyOptimizer (ZeRO stage 1)."""
