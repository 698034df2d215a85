"""Breaks second_accelerator: preparing a model tears down the engine of the previously prepared one."""

import torch

from drivetrain import hookimpl
from drivetrain.backends.local import PLUGIN_INFO  # noqa: F401

_current = []


class Engine(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.torn_down = False

    def forward(self, *args, **kwargs):
        if self.torn_down:
            raise RuntimeError("this engine was torn down when the next model was prepared")
        return self.module(*args, **kwargs)


@hookimpl
def wrap_model(model, evaluation_mode):
    for engine in _current:
        engine.torn_down = True
    _current[:] = [Engine(model)]
    return _current[0]
