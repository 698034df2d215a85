"""Breaks unwrap_model: the backend trains a copy of the model, so unwrap_model hands back the stale original."""

import copy

from drivetrain import hookimpl
from drivetrain.contract.info import Capabilities, PluginInfo

PLUGIN_INFO = PluginInfo(kind="backend", capabilities=Capabilities(precisions=("no",)))
_copies = {}


@hookimpl
def wrap_model(model):
    clone = copy.deepcopy(model)
    _copies.update({id(old): new for old, new in zip(model.parameters(), clone.parameters())})
    return clone


@hookimpl
def wrap_optimizer(optimizer):
    for group in optimizer.param_groups:
        group["params"] = [_copies.get(id(p), p) for p in group["params"]]
    return optimizer


# Checkpoints of the trained copy, so that only unwrap_model sees the stale original.
@hookimpl
def save_state(output_dir, models, optimizers, schedulers):
    import os

    import torch

    state = {
        "models": [m.state_dict() for m in models],
        "optimizers": [o.state_dict() for o in optimizers],
        "schedulers": [s.state_dict() for s in schedulers],
    }
    torch.save(state, os.path.join(output_dir, "engine.pt"))
    return True


@hookimpl
def load_state(input_dir, models, optimizers, schedulers):
    import os

    import torch

    state = torch.load(os.path.join(input_dir, "engine.pt"), weights_only=False)
    for objects, states in (
        (models, state["models"]),
        (optimizers, state["optimizers"]),
        (schedulers, state["schedulers"]),
    ):
        for obj, obj_state in zip(objects, states):
            obj.load_state_dict(obj_state)
    return True
