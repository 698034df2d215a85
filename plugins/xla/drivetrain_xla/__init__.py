"""drivetrain-xla: XLA devices (TPUs, and torch_xla's CPU device) for drivetrain (see docs/xla.md)."""
