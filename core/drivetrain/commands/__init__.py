"""The ``drivetrain`` command line: one module per subcommand."""
