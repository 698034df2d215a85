"""Accelerate compatibility, in one place, split by kind:

- tables (the one place where the kernel names backends): ``paths`` (Accelerate's module paths and the names each
  holds, including the paths generated without a file, and drivetrain's own paths made the same way),
  ``install_hints`` (which distribution to install), ``cli_options`` (Accelerate's command-line surface that
  belongs to plugins), ``availability`` (the ``is_*_available`` checks, specified), ``distributions``;
- ``moved`` (drivetrain's own moved module paths) and ``placeholders`` (names of plugins not installed);
- ``accelerate_api``: code that exists only because Accelerate has it, with no other kernel home.
- ``accelerate_commands``: the same for Accelerate's command entry points that call drivetrain's commands
  (``accelerate.commands.launch``'s ``launch_command``, ...), a layer above ``drivetrain.commands``.
"""
