"""Breaks checkpoint_resume and checkpoint_portable: save_state writes the optimizer state of the main
process's shard (ZeRO's inner optimizer) as if it were the whole state, instead of consolidating it."""

from drivetrain_zero1.plugin import PLUGIN_INFO, setup_process_group, wrap_model, wrap_optimizer  # noqa: F401

from drivetrain import hookimpl
from drivetrain.plugin_api.checkpoint import write_training_objects


class ShardOnly:
    def __init__(self, zero):
        self.zero = zero

    def state_dict(self):
        return self.zero.optim.state_dict()  # the mistake: no consolidate_state_dict()


@hookimpl
def save_state(output_dir, accelerator, weights, optimizers, schedulers, safe_serialization):
    shards = [ShardOnly(getattr(o, "optimizer", o)) for o in optimizers]
    write_training_objects(output_dir, accelerator, weights, shards, schedulers, safe_serialization)
    return True
