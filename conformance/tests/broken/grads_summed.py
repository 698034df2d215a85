"""Breaks multi_process_matches_combined_batch: gradients are summed over processes, not averaged."""

import torch.distributed as dist

from drivetrain import hookimpl
from drivetrain_ddp import plugin as ddp
from drivetrain_ddp.plugin import PLUGIN_INFO, setup_process_group  # noqa: F401


def _allreduce_sum(state, bucket):
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


@hookimpl
def wrap_model(model, accelerator, evaluation_mode):
    wrapped = ddp.wrap_model(model=model, accelerator=accelerator, evaluation_mode=evaluation_mode)
    if wrapped is not None:
        wrapped.register_comm_hook(None, _allreduce_sum)
    return wrapped
