"""flat-dp, broken: gradients are averaged in optimizer.step() instead of by the end of the synchronised
backward, so clip_grad_norm_ clips each process's own gradients (caught by adamw_schedule_matches_local, and
by checkpoint_portable, which resumes that training) and a backward's gradients are not the synchronised ones
(caught by no_sync). Declared for fp32 only: with fp16, a process whose gradients overflow skips the step and
the others wait in its all-reduce for ever (the suite reports that hang too)."""

import torch.distributed as dist
from flat_dp import declaring, setup_process_group, wrap_model  # noqa: F401

from drivetrain import hookimpl

PLUGIN_INFO = declaring("no")  # with fp16 it hangs (see above)


class AveragingStep:
    """The user's optimizer, averaging every gradient across processes when it steps."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    @property
    def defaults(self):
        return self.inner.defaults

    def step(self, closure=None):
        for group in self.inner.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:  # the mistake: too late, clipping has read them already
                    dist.all_reduce(parameter.grad)
                    parameter.grad /= dist.get_world_size()
        return self.inner.step(closure)

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict):
        self.inner.load_state_dict(state_dict)


@hookimpl
def wrap_optimizer(optimizer, accelerator):
    if accelerator.num_processes == 1:
        return None
    return AveragingStep(optimizer)
