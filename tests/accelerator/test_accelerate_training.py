"""What scripts written for Accelerate observe of the Accelerator itself: the scheduler and a skipped
optimizer step, kwargs handlers, unwrapping, the device variable, state resets, checkpoint registration,
prepare, splitting inputs between processes, and the process group kept across a reset (issue 17's findings of
the peer suite; each test asserts what such a script observes)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Accelerator
from drivetrain.config.kwargs_handlers import KwargsHandler


def test_scheduler_does_not_step_when_the_optimizer_step_was_skipped():
    # Accelerate's AcceleratedOptimizer keeps the overflow flag in `_is_overflow`; scripts set it directly.
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda n: 1 - n / 10)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    optimizer._is_overflow = False
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(0.9)
    optimizer._is_overflow = True
    assert optimizer.step_was_skipped
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(0.9)


def test_user_dataclass_kwargs_handler_reports_changed_fields():
    @dataclasses.dataclass
    class MyHandler(KwargsHandler):
        a: int = 0
        b: bool = False
        c: float = 3.0
        d: list = dataclasses.field(default_factory=list)

    assert MyHandler().to_kwargs() == {}
    assert MyHandler(a=2).to_kwargs() == {"a": 2}
    assert MyHandler(a=2, c=2.25, d=[1]).to_kwargs() == {"a": 2, "c": 2.25, "d": [1]}


def test_unwrap_keeps_compile_but_removes_data_parallel_inside_it():
    model = torch.nn.Linear(2, 2)
    compiled_parallel = torch.compile(torch.nn.DataParallel(model))
    accelerator = Accelerator(cpu=True)
    unwrapped = accelerator.unwrap_model(compiled_parallel, keep_torch_compile=True)
    assert unwrapped._orig_mod is model
    assert isinstance(compiled_parallel._orig_mod, torch.nn.DataParallel)  # the caller's object is untouched
    assert accelerator.unwrap_model(compiled_parallel, keep_torch_compile=False) is model


def test_torch_device_variable_overrides_the_detected_device(monkeypatch):
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:3")
    monkeypatch.setattr(torch.cpu, "set_device", lambda device: None, raising=False)
    assert str(Accelerator().device) == "cpu:3"


def test_torch_device_variable_rejects_a_non_device(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_TORCH_DEVICE", "warp-drive")
    with pytest.raises(Exception, match="DRIVETRAIN_TORCH_DEVICE='warp-drive' is not a torch device"):
        Accelerator()


def test_state_after_reset_says_what_happened():
    from drivetrain import PartialState
    from drivetrain.state import AcceleratorState

    state = PartialState(cpu=True)
    with pytest.raises(AttributeError, match="'PartialState' object has no attribute 'someotherthing'"):
        state.someotherthing  # noqa: B018
    state._reset_state()
    with pytest.raises(AttributeError, match=r"`PartialState._reset_state\(\)` was called"):
        state.num_processes  # noqa: B018
    state.someotherthing = "value"
    assert state.someotherthing == "value"
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match=r"`AcceleratorState._reset_state\(\)` was called"):
        AcceleratorState.__new__(AcceleratorState).num_processes  # noqa: B018


def test_register_for_checkpointing_names_the_item_without_state_dict():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="Item at index 0 .*Item at index 1"):
        accelerator.register_for_checkpointing(torch.zeros(1), torch.ones(1), torch.nn.Linear(1, 1))


def test_prepare_marks_what_it_prepared_and_does_not_prepare_a_model_twice():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = DataLoader(TensorDataset(torch.arange(4)), batch_size=2)
    other = [1, 2, 3]
    prepared = accelerator.prepare(model, optimizer, scheduler, loader, other)
    assert [getattr(obj, "_is_accelerate_prepared", False) for obj in prepared] == [True] * 4 + [False]
    count = len(accelerator._models)
    assert accelerator.prepare_model(prepared[0]) is prepared[0]
    assert len(accelerator._models) == count


def test_split_between_processes_gives_each_process_rows_of_a_dataset():
    # Accelerate's test_script: a `datasets.Dataset` is split by rows (slicing one gives a dict of columns).
    datasets = pytest.importorskip("datasets")
    from drivetrain.state import split_for_process

    even = datasets.Dataset.from_list([{"k": v} for v in range(4)])
    shares = [split_for_process(even, 2, rank) for rank in range(2)]
    assert [share["k"] for share in shares] == [[0, 1], [2, 3]]
    odd = datasets.Dataset.from_list([{"k": v} for v in range(3)])
    assert [split_for_process(odd, 2, rank)["k"] for rank in range(2)] == [[0, 1], [2]]
    assert [split_for_process(odd, 2, rank, apply_padding=True)["k"] for rank in range(2)] == [[0, 1], [2, 2]]


def test_split_between_processes_pads_with_the_last_input_element():
    from drivetrain.state import split_for_process

    data = [0, 1, 2, 3, 4]
    assert [split_for_process(data, 4, rank, apply_padding=True) for rank in range(4)] == [
        [0, 1],
        [2, 4],
        [3, 4],
        [4, 4],
    ]
    tensor = torch.arange(5)
    assert split_for_process(tensor, 4, 1, apply_padding=True).tolist() == [2, 4]


def test_destroy_process_group_on_a_state_kept_across_a_reset():
    # Accelerate's test_script ends with `state.destroy_process_group()` on an AcceleratorState built before
    # `AcceleratorState._reset_state()`: the process group belongs to PartialState, so it still works.
    from drivetrain.state import AcceleratorState, PartialState

    Accelerator(cpu=True)
    state = AcceleratorState()
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match="`AcceleratorState` object has no attribute"):
        state.mixed_precision  # noqa: B018
    state.destroy_process_group()
    state.destroy_process_group()  # twice is fine
    assert PartialState().initialized


def test_unwrapping_undoes_a_convert_outputs_to_fp32_forward_saved_in_original_forward():
    from drivetrain.utils import convert_outputs_to_fp32, extract_model_from_parallel

    model = torch.nn.Linear(2, 1)
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(model.forward)
    unwrapped = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in unwrapped.__dict__ and "_original_forward" not in unwrapped.__dict__
    restored = pickle.loads(pickle.dumps(unwrapped))
    assert torch.equal(restored(torch.ones(1, 2)), model(torch.ones(1, 2)))
