"""The kernel's reference backend, ``local``: a plugin like any other (registered through the
``drivetrain.plugins`` entry point, importing only ``drivetrain.plugin_api``)."""
