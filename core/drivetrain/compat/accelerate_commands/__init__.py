"""Accelerate's command entry points that are drivetrain's commands under Accelerate's names and signatures
(``accelerate.commands.launch``'s ``launch_command_parser``, ``launch_command``, ...): code that exists only
because Accelerate has it, like :mod:`drivetrain.compat.accelerate_api`, but above :mod:`drivetrain.commands`,
whose commands it calls (``accelerate_api`` sits below the commands, which may use it). Scripts reach it through
Accelerate's paths (``drivetrain.commands.launch`` serves these names from a table); the kernel does not import
from here."""
