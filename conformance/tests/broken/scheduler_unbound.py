"""Breaks adamw_schedule_matches_local: wrap_optimizer returns a wrapper that keeps its own copy of the
param groups, so the user's scheduler (rebound to the wrapper) changes a learning rate nobody steps with."""

from drivetrain import hookimpl
from drivetrain.plugin_api import Capabilities, PluginInfo

PLUGIN_INFO = PluginInfo(kind="backend", capabilities=Capabilities(precisions=("no",)))


class CopiedGroups:
    def __init__(self, inner):
        self.inner = inner
        self.param_groups = [dict(group) for group in inner.param_groups]  # the mistake: copies
        self.defaults = inner.defaults
        self.state = inner.state

    def step(self, closure=None):
        return self.inner.step(closure)

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict):
        self.inner.load_state_dict(state_dict)


@hookimpl
def wrap_optimizer(optimizer):
    return CopiedGroups(optimizer)
