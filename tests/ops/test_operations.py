"""drivetrain.operations and drivetrain.operations.random in one process: nested structures, identities, seeding."""

from __future__ import annotations

import collections
import io
import pickle
import random
from collections import OrderedDict, UserDict, defaultdict

import numpy as np
import pytest
import torch

from drivetrain import operations as ops
from drivetrain.operations.random import (
    capture_rng_state,
    restore_rng_state,
    set_seed,
    synchronize_rng_state,
    synchronize_rng_states,
)
from drivetrain.state import GradientState, PartialState, reset_state

Point = collections.namedtuple("Point", "x y")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.delenv("DRIVETRAIN_DEBUG_MODE", raising=False)
    reset_state()
    yield
    reset_state()


def nested(value: float = 1.0):
    return {
        "list": [torch.full((2,), value), torch.full((1, 2), value)],
        "tuple": (torch.full((3,), value),),
        "point": Point(torch.full((2,), value), torch.full((2,), -value)),
        "ordered": OrderedDict(a=torch.full((1,), value)),
        "label": "kept",
    }


def assert_same_types(a, b):
    assert type(a) is type(b)
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_types(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same_types(a[key], b[key])


# -- recursively_apply -------------------------------------------------------------------------------------------
def test_recursively_apply_keeps_every_container_type():
    data = nested()
    out = ops.recursively_apply(lambda t: t * 2, data)
    assert_same_types(data, out)
    assert out["point"].y.tolist() == [-2.0, -2.0]
    assert out["label"] == "kept"
    assert torch.equal(out["ordered"]["a"], torch.tensor([2.0]))


def test_recursively_apply_rebuilds_mapping_subclasses_and_structseqs():
    counts = defaultdict(list, {"a": torch.ones(1)})
    user = UserDict({"b": torch.ones(1)})
    structseq = torch.max(torch.tensor([[1.0, 3.0], [2.0, 0.0]]), dim=0)
    out = ops.recursively_apply(lambda t: t + 1, {"d": counts, "u": user, "s": structseq})
    assert type(out["d"]) is defaultdict and out["d"].default_factory is list
    assert type(out["u"]) is UserDict and out["u"]["b"].item() == 2.0
    assert type(out["s"]) is type(structseq) and out["s"].values.tolist() == [3.0, 4.0]


def test_recursively_apply_error_on_other_type_names_the_type():
    with pytest.raises(TypeError, match=r"Unsupported types \(<class 'str'>\)"):
        ops.recursively_apply(lambda t: t, [torch.ones(1), "text"], error_on_other_type=True)


# -- send_to_device ------------------------------------------------------------------------------------------------
def test_send_to_device_returns_tensors_already_there_without_copying():
    batch = (torch.ones(2), torch.zeros(3, dtype=torch.long))
    out = ops.send_to_device(batch, "cpu")
    assert type(out) is tuple and out[0] is batch[0] and out[1] is batch[1]
    single = torch.ones(1)
    assert ops.send_to_device(single, torch.device("cpu")) is single


def test_send_to_device_moves_nested_data_and_honours_skip_keys():
    data = {"x": torch.ones(2), "p": Point(torch.ones(1), [torch.zeros(1)]), "keep": torch.ones(1), "n": 3}
    out = ops.send_to_device(data, "meta", skip_keys="keep")
    assert out["x"].device.type == "meta" and out["p"].y[0].device.type == "meta"
    assert type(out["p"]) is Point and type(out["p"].y) is list
    assert out["keep"] is data["keep"] and out["n"] == 3
    out = ops.send_to_device(data, "meta", skip_keys=["keep", "x"])
    assert out["x"].device.type == "cpu" and out["keep"].device.type == "cpu"


def test_send_to_device_uses_an_objects_own_to_method():
    class Batch:
        def __init__(self):
            self.moved_to = None

        def to(self, device):  # no non_blocking parameter
            self.moved_to = device
            return self

    batch = Batch()
    assert ops.send_to_device([batch], "meta")[0].moved_to == torch.device("meta")


# -- describing, slicing, concatenating ---------------------------------------------------------------------------
def test_data_structure_round_trip():
    data = {"a": torch.ones(2, 3, dtype=torch.float16), "b": [torch.zeros(4, dtype=torch.long)]}
    structure = ops.get_data_structure(data)
    assert structure["a"] == ops.TensorInformation(torch.Size([2, 3]), torch.float16)
    empty = ops.initialize_tensors(structure)
    assert empty["a"].shape == (2, 3) and empty["a"].dtype == torch.float16
    assert empty["b"][0].shape == (4,) and empty["b"][0].dtype == torch.long
    assert ops.get_shape(data) == {"a": [2, 3], "b": [[4]]}


def test_find_batch_size():
    assert ops.find_batch_size({"ids": [torch.zeros(5, 2)], "mask": torch.zeros(5)}) == 5
    assert ops.find_batch_size(Point(torch.zeros(7), None)) == 7
    with pytest.raises(ValueError, match="empty"):
        ops.find_batch_size([])
    with pytest.raises(TypeError, match="got str"):
        ops.find_batch_size("text")
    assert ops.ignorant_find_batch_size("text") is None


def test_slice_and_concatenate_are_inverse():
    data = {"a": torch.arange(6), "b": Point(torch.arange(6) * 2, [torch.arange(12).reshape(6, 2)])}
    parts = [ops.slice_tensors(data, slice(i, i + 2)) for i in range(0, 6, 2)]
    assert parts[1]["a"].tolist() == [2, 3] and type(parts[1]["b"]) is Point
    whole = ops.concatenate(parts)
    assert_same_types(whole, data)
    assert torch.equal(whole["b"].y[0], data["b"].y[0])
    with pytest.raises(TypeError, match="only concatenate tensors"):
        ops.concatenate([["a"], ["b"]])


def test_convert_to_fp32_only_touches_half_precision():
    data = [
        torch.ones(1, dtype=torch.float16),
        torch.ones(1, dtype=torch.bfloat16),
        torch.ones(1, dtype=torch.long),
        torch.ones(1, dtype=torch.float64),
        "x",
    ]
    out = ops.convert_to_fp32(data)
    assert [getattr(t, "dtype", None) for t in out] == [
        torch.float32,
        torch.float32,
        torch.long,
        torch.float64,
        None,
    ]
    forward = ops.convert_outputs_to_fp32(lambda x: {"y": x.half()})
    assert forward(torch.ones(1))["y"].dtype == torch.float32
    with pytest.raises(pickle.PicklingError, match="unwrap"):
        pickle.dumps(forward.__wrapped__)


def test_listify():
    assert ops.listify({"a": torch.tensor([1, 2]), "b": (torch.tensor(1.5, dtype=torch.bfloat16),)}) == {
        "a": [1, 2],
        "b": (1.5,),
    }


# -- collectives on one process -----------------------------------------------------------------------------------
def test_collectives_are_identities_on_one_process():
    data = nested(3.0)
    assert ops.gather(data) is data
    assert ops.broadcast(data, from_process=0) is data
    assert ops.pad_across_processes(data["list"], dim=0) is data["list"]
    assert ops.gather_object(["a", "b"]) == ["a", "b"]
    objects = [1, 2]
    assert ops.broadcast_object_list(objects) is objects
    assert torch.equal(ops.copy_tensor_to_devices(torch.ones(2)), torch.ones(2))


def test_reduce_returns_a_copy_and_validates_the_reduction():
    tensor = torch.tensor([1.0, 2.0])
    for reduction in ("mean", "sum", "max", "none"):
        out = ops.reduce(tensor, reduction=reduction)
        assert torch.equal(out, tensor) and out is not tensor
    assert torch.equal(ops.reduce({"t": tensor}, reduction="sum", scale=2.0)["t"], tensor * 2)
    with pytest.raises(ValueError, match="valid: mean, sum"):
        ops.reduce(tensor, reduction="average")
    with pytest.raises(TypeError, match=r"Unsupported types \(<class 'str'>\)"):
        ops.reduce(["x"])


def test_broadcast_object_list_needs_a_list():
    with pytest.raises(TypeError, match="needs a list"):
        ops.broadcast_object_list((1, 2))


class LoaderPosition:
    def __init__(self, end_of_dataloader, remainder):
        self.end_of_dataloader = end_of_dataloader
        self.remainder = remainder


@pytest.mark.parametrize(
    ("end", "remainder", "kept"), [(True, 3, 3), (True, 0, 4), (True, -1, 4), (False, 3, 4)]
)
def test_gather_for_metrics_drops_padding_only_on_the_last_batch(end, remainder, kept):
    gradient_state = GradientState()
    loader = LoaderPosition(end, remainder)
    gradient_state._add_dataloader(loader)
    try:
        predictions, labels = ops.gather_for_metrics((torch.arange(4), torch.arange(4) * 2))
        assert predictions.tolist() == list(range(kept)) and labels.tolist() == [2 * i for i in range(kept)]
        assert ops.gather_for_metrics(["a", "b", "c", "d"]) == ["a", "b", "c", "d"][:kept]
    finally:
        gradient_state._remove_dataloader(loader)


def test_gather_for_metrics_takes_explicit_states():
    gradient_state = GradientState()
    loader = LoaderPosition(True, 1)
    gradient_state._add_dataloader(loader)
    try:
        out = ops.gather_for_metrics(
            torch.arange(3), use_gather_object=True, state=PartialState(), gradient_state=gradient_state
        )
        assert out.tolist() == [0]
    finally:
        gradient_state._remove_dataloader(loader)


# -- random --------------------------------------------------------------------------------------------------------
def draw():
    return random.random(), float(np.random.rand()), torch.rand(2).tolist()


def test_set_seed_makes_every_library_repeat():
    set_seed(11)
    first = draw()
    set_seed(11)
    assert draw() == first
    set_seed(12)
    assert draw() != first
    set_seed(11, device_specific=True)  # process index 0 on one process
    assert draw() == first
    with pytest.raises(TypeError, match="seed must be an int"):
        set_seed("11")


def test_set_seed_deterministic_switches_torch_to_deterministic_algorithms():
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        set_seed(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(previous)


def test_capture_and_restore_survive_a_weights_only_checkpoint():
    set_seed(5)
    random.random()
    np.random.randn()  # leaves a cached Gaussian in numpy's state
    saved = capture_rng_state()
    assert {"python", "numpy", "torch"} <= set(saved)
    expected = draw()
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    set_seed(99)
    restore_rng_state(loaded)
    assert draw() == expected


def test_restore_rng_state_warns_about_states_it_cannot_place():
    saved = capture_rng_state()
    saved["someaccelerator"] = torch.zeros(1)
    with pytest.warns(UserWarning, match="someaccelerator"):
        restore_rng_state(saved)
    with pytest.raises(TypeError, match="capture_rng_state"):
        restore_rng_state([1])


def test_synchronize_rng_states_on_one_process_keeps_the_stream_and_checks_its_arguments():
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    generator = torch.Generator().manual_seed(4)
    synchronize_rng_states(["torch", "generator"], generator=generator)
    assert torch.equal(torch.rand(2), expected)
    with pytest.raises(ValueError, match="generator=<torch.Generator>"):
        synchronize_rng_state("generator")
    with pytest.raises(ValueError, match="unknown rng type 'dice'; valid: "):
        synchronize_rng_state("dice")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' is not available"):
            synchronize_rng_state("cuda")
