"""drivetrain-fp8: ``mixed_precision="fp8"`` through torchao, TransformerEngine or MS-AMP."""
