"""drivetrain-ipex: Intel Extension for PyTorch and Intel XPUs for drivetrain (see docs/ipex.md)."""
