"""flat-dp, broken: it declares joinable=True, but its FlatDataParallel is no torch Joinable, so torch's Join
would refuse it (and could not shadow its all-reduces anyway)."""

import dataclasses

from flat_dp import backward, declaring, reference_backward, setup_process_group, wrap_model, wrappers  # noqa: F401

_declared = declaring("no")  # fewer precisions, fewer runs: the mistake shows in this one
PLUGIN_INFO = dataclasses.replace(
    _declared,
    capabilities=dataclasses.replace(_declared.capabilities, joinable=True),  # the mistake
)
