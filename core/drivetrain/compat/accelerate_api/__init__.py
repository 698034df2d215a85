"""Code that exists only because Accelerate has it at one of its paths and that has no other home in the kernel
(Accelerate's helper functions, checks and constants), one module per topic. Scripts reach it through
Accelerate's paths (``drivetrain.utils.imports``, ...), which are generated from the tables in
:mod:`drivetrain.compat.paths`; no layer below it imports from here (lint-imports), only Accelerate's commands
(``drivetrain.commands``) do."""
