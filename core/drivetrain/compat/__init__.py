"""Accelerate compatibility: names.py lists Accelerate's names that belong to backend plugins (the one file of
the kernel that names backends; it words the error when a plugin is missing)."""
