"""The deepspeed backend joins the process group through the kernel's ``join_process_group`` (so it has the
kernel's exit handler, barrier timeout, restart-safe store and NCCL ``device_id``), and DeepSpeed adopts that
group. In several processes: test_deepspeed_multiprocess.py (a run without end_training() leaves the group
at exit)."""

from __future__ import annotations

import sys

import torch.distributed as dist


def test_one_process_forms_a_group_of_one_that_deepspeed_adopts_and_shutdown_forgets(one_process):
    from drivetrain import DistributedType, PartialState

    state = PartialState(backend="deepspeed")
    import deepspeed.comm

    assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
    assert deepspeed.comm.is_initialized() and state.distributed_type == DistributedType.DEEPSPEED
    state.destroy_process_group()
    assert not dist.is_initialized()
    assert sys.modules["deepspeed.comm.comm"].cdb is None  # a later Accelerator starts DeepSpeed afresh
