"""Code that exists only because Accelerate has it at one of its paths and that has no other home in the kernel
(Accelerate's helper functions and base classes). Scripts reach it through Accelerate's paths, which are generated
from the tables in :mod:`drivetrain.compat.paths`; the kernel itself does not import from here."""
