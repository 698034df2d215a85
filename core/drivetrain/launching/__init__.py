"""Starting processes from Python, without the ``drivetrain launch`` command line.

forked.py   notebook_launcher and debug_launcher: the current process forked into a job (torch's elastic
            launcher), for notebooks and tests; Accelerate's ``accelerate.launchers`` path serves them
ports.py    free_port: a free TCP port for a rendezvous on this machine (plugins' launchers use it too)
testing.py  helpers for tests that run a script in real processes; ``drivetrain.testing`` serves them

Nothing is imported here: ``drivetrain.plugin_api`` imports ports.py alone.
"""
