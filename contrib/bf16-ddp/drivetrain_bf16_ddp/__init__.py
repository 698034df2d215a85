"""drivetrain-bf16-ddp: an example third-party backend, written by following docs/plugins/tutorial.md."""
