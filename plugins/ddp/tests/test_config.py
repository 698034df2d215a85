"""DistributedDataParallelKwargs, DDPCommunicationHookType and LocalSGD in one process."""

from __future__ import annotations

import pytest
import torch

from drivetrain.errors import ConfigurationError
from drivetrain_ddp.config import DDPCommunicationHookType, DistributedDataParallelKwargs


def test_public_names_come_from_drivetrain():
    import drivetrain
    from drivetrain_ddp.local_sgd import LocalSGD

    assert drivetrain.DistributedDataParallelKwargs is DistributedDataParallelKwargs
    assert drivetrain.DDPCommunicationHookType is DDPCommunicationHookType
    assert drivetrain.LocalSGD is LocalSGD


def test_default_passes_nothing_to_torch():
    assert DistributedDataParallelKwargs().to_kwargs() == {}


def test_only_changed_ddp_fields_reach_torch_and_comm_fields_never_do():
    handler = DistributedDataParallelKwargs(
        find_unused_parameters=True,
        bucket_cap_mb=50,
        static_graph=True,
        comm_hook="power_sgd",
        comm_wrapper="fp16",
        comm_state_option={"matrix_approximation_rank": 2},
    )
    assert handler.to_kwargs() == {"find_unused_parameters": True, "bucket_cap_mb": 50, "static_graph": True}
    assert handler.comm_hook is DDPCommunicationHookType.POWER_SGD
    assert handler.comm_wrapper is DDPCommunicationHookType.FP16


def test_every_ddp_kwarg_is_a_ddp_constructor_argument():
    import inspect

    accepted = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    handler = DistributedDataParallelKwargs(
        dim=1,
        broadcast_buffers=False,
        bucket_cap_mb=1,
        find_unused_parameters=True,
        check_reduction=True,
        gradient_as_bucket_view=True,
        static_graph=True,
    )
    assert set(handler.to_kwargs()) <= set(accepted)
    assert len(handler.to_kwargs()) == 7


@pytest.mark.parametrize("value", ["FP16", "fp16", DDPCommunicationHookType.FP16])
def test_hook_type_accepts_members_and_strings(value):
    assert DistributedDataParallelKwargs(comm_hook=value).comm_hook is DDPCommunicationHookType.FP16


def test_hook_type_compares_to_its_value():
    assert DDPCommunicationHookType.BATCHED_POWER_SGD == "batched_power_sgd"
    assert [member.name for member in DDPCommunicationHookType] == [
        "NO",
        "FP16",
        "BF16",
        "POWER_SGD",
        "BATCHED_POWER_SGD",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"comm_hook": "int8"}, "comm_hook='int8' is not valid; choose one of: no, fp16, bf16, power_sgd"),
        ({"comm_hook": "power_sgd", "comm_wrapper": "power_sgd"}, "comm_wrapper='power_sgd' is not valid"),
        ({"comm_wrapper": "fp16"}, "comm_wrapper='fp16' wraps a communication hook, but comm_hook is 'no'"),
        ({"comm_state_option": {"matrix_approximation_rank": 2}}, "only used by the PowerSGD hooks"),
        (
            {"comm_hook": "power_sgd", "comm_state_option": {"rank": 2}},
            "comm_state_option has unknown option(s) rank; PowerSGDState accepts: matrix_approximation_rank",
        ),
        (
            {"comm_hook": "power_sgd", "comm_state_option": [("matrix_approximation_rank", 2)]},
            "comm_state_option must be a dict",
        ),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb must be > 0"),
        ({"bucket_cap_mb": "25"}, "bucket_cap_mb must be a number of megabytes"),
        ({"find_unused_parameters": "yes"}, "find_unused_parameters must be True or False"),
        ({"static_graph": 1}, "static_graph must be True or False"),
        ({"dim": 0.5}, "dim must be an integer"),
        ({"dim": True}, "dim must be an integer"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(kwargs, message):
    with pytest.raises(ConfigurationError) as error:
        DistributedDataParallelKwargs(**kwargs)
    assert "DistributedDataParallelKwargs." in str(error.value)
    assert message in str(error.value)


def test_accelerator_accepts_the_handler_and_one_process_is_not_wrapped():
    from drivetrain import Accelerator

    handler = DistributedDataParallelKwargs(find_unused_parameters=True)
    accelerator = Accelerator(backend="ddp", kwargs_handlers=[handler], cpu=True)
    assert accelerator.kwargs_handlers == [handler]
    model = torch.nn.Linear(2, 2)
    # One process: the ddp backend behaves like the reference backend (no DDP wrapper, nothing to sync).
    assert accelerator.prepare(model) is model


def test_local_sgd_is_a_no_op_in_one_process():
    from drivetrain import Accelerator, LocalSGD

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=1) as local_sgd:
        assert not local_sgd.enabled
        local_sgd.step()
    assert local_sgd.num_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("steps", [0, -1, 1.5, True])
def test_local_sgd_rejects_bad_step_counts(steps):
    from drivetrain import Accelerator, LocalSGD

    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="local_sgd_steps must be an integer >= 1"):
        LocalSGD(accelerator=accelerator, model=torch.nn.Linear(2, 2), local_sgd_steps=steps)
