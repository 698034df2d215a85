"""drivetrain-mps: Apple-silicon GPUs (torch's ``mps`` device) for drivetrain (see docs/mps.md)."""
