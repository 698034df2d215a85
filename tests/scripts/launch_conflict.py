"""Launched by tests: asks for bf16 in the script itself; launched with another precision, the kernel must
refuse naming both sources."""

from drivetrain import Accelerator

Accelerator(mixed_precision="bf16")
print("no conflict detected")
