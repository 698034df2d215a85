"""A backend's process group through plugin_api alone: join_process_group, a DDP model from
wrap_data_parallel (registered with release_at_shutdown), one training step, then either the environment's
shutdown (``--ending shutdown``) or nothing (``--ending exit``: the exit handler must release the model and
leave the group). Launched by tests/launch/test_process_group.py; prints ``CHECK <name> ok`` per check."""

from __future__ import annotations

import argparse
import atexit
import types

import torch
import torch.distributed as dist

from drivetrain.plugin_api import DistributedType, join_process_group, wrap_data_parallel

parser = argparse.ArgumentParser()
parser.add_argument("--ending", choices=("shutdown", "exit"), required=True)
ending = parser.parse_args().ending

model = None


def report_at_exit() -> None:
    """Registered before the group exists, so it runs after the exit handler join_process_group installs."""
    if not dist.is_initialized() and model is not None and model.__dict__.get("reducer") is None:
        print(f"CHECK released ok rank={rank}", flush=True)


if ending == "exit":
    atexit.register(report_at_exit)

environment = join_process_group(torch.device("cpu"), {"timeout": 60})
rank = dist.get_rank()
if (
    environment.num_processes == 2
    and environment.process_index == rank
    and environment.distributed_type == DistributedType.MULTI_CPU
    and environment.torch_backend == "gloo"
    and environment.collectives.world_size == 2
):
    print(f"CHECK environment ok rank={rank}", flush=True)

torch.manual_seed(rank)  # different inputs per rank; DDP broadcasts rank 0's weights at wrap time
# What wrap_data_parallel reads of the Accelerator a hook receives.
accelerator = types.SimpleNamespace(num_processes=environment.num_processes, device=torch.device("cpu"))
frozen = torch.nn.Linear(4, 2).requires_grad_(False)
if (
    wrap_data_parallel(torch.nn.Linear(4, 2), accelerator, evaluation_mode=True) is None
    and wrap_data_parallel(frozen, accelerator) is None
):
    print(f"CHECK nothing_to_wrap ok rank={rank}", flush=True)
model = wrap_data_parallel(torch.nn.Linear(4, 2), accelerator)
assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
if wrap_data_parallel(model, accelerator) is None:  # already wrapped: unchanged
    print(f"CHECK wrapped_once ok rank={rank}", flush=True)
model(torch.randn(8, 4)).square().sum().backward()
gradients = environment.collectives.all_gather(model.module.weight.grad.clone())
if torch.equal(gradients[0], gradients[1]) and gradients[0].abs().sum() > 0:
    print(f"CHECK averaged ok rank={rank}", flush=True)

if ending == "shutdown":
    environment.shutdown()
    environment.shutdown()  # a second call (end_training, then the exit handler) does nothing
    if not dist.is_initialized() and model.__dict__.get("reducer") is None:
        print(f"CHECK released ok rank={rank}", flush=True)
    if model.module(torch.ones(1, 4)).shape == (1, 2):  # the user's module still works after release
        print(f"CHECK module ok rank={rank}", flush=True)
