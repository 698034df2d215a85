"""Breaks hooks_match_spec: a hook function without @hookimpl, which drivetrain would never call."""

from drivetrain.backends.local import PLUGIN_INFO  # noqa: F401  (same capabilities as the reference)


def clip_grad_norm(parameters, max_norm, norm_type):
    raise AssertionError("never called: the function lacks @hookimpl")
