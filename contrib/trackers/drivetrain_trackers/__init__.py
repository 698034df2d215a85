"""drivetrain's experiment trackers, registered by name through the ``register_extensions`` hook.

Importing this package imports none of the tracker libraries; each tracker imports its own when built.
"""
