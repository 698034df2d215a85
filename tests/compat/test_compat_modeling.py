"""Accelerate's tensor-level helpers with Accelerate's signatures (drivetrain.utils.modeling / .offload /
.imports / .versions): real tensors and files, compared with what the functions are documented to do."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from drivetrain.utils import (
    OffloadedWeightsLoader,
    compare_versions,
    extract_submodules_state_dict,
    is_torch_version,
    offload_state_dict,
)
from drivetrain.utils.modeling import (
    clean_device_map,
    convert_file_size_to_int,
    dtype_byte_size,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)


def test_offloaded_state_dict_reads_back_bit_for_bit(tmp_path):
    state = {
        "a.weight": torch.randn(3, 4),
        "a.bias": torch.randn(4).to(torch.bfloat16),  # numpy has no bfloat16: stored as its bits
        "step": torch.tensor(7),  # 0-d
    }
    offload_state_dict(tmp_path, state)
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["a.bias"] == {"dtype": "bfloat16", "shape": [4]}
    assert sorted(p.name for p in tmp_path.glob("*.dat")) == ["a.bias.dat", "a.weight.dat", "step.dat"]
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    assert sorted(loader) == sorted(state)
    for name, tensor in state.items():
        assert loader[name].dtype == tensor.dtype and torch.equal(loader[name], tensor)
    in_memory = OffloadedWeightsLoader(state_dict={"a.weight": torch.zeros(3, 4)}, save_folder=tmp_path)
    assert torch.equal(in_memory["a.weight"], torch.zeros(3, 4))  # memory wins over disk


def test_extract_submodules_state_dict_does_not_take_a_longer_name_for_a_child():
    state = {f"h.{i}.w": torch.tensor(float(i)) for i in (1, 10, 2)}
    assert sorted(extract_submodules_state_dict(state, ["h.1"])) == ["h.1.w"]


def test_set_module_tensor_to_device_fills_a_meta_parameter_in_place():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    value = torch.arange(6, dtype=torch.float64).reshape(3, 2)
    set_module_tensor_to_device(model, "0.weight", "cpu", value=value)
    assert (
        isinstance(model[0].weight, nn.Parameter) and model[0].weight.dtype == torch.float32
    )  # old dtype kept
    assert torch.equal(model[0].weight, value.float())
    set_module_tensor_to_device(model, "1.running_mean", "cpu", value=torch.ones(3))
    assert "running_mean" in model[1]._buffers and torch.equal(model[1].running_mean, torch.ones(3))
    with pytest.raises(ValueError, match='Trying to set a tensor of shape torch.Size\\(\\[2\\]\\) in "bias"'):
        set_module_tensor_to_device(model, "0.bias", "cpu", value=torch.ones(2))
    with pytest.raises(ValueError, match="meta device, we need a `value`"):
        set_module_tensor_to_device(model, "0.bias", "cpu")


def test_retie_parameters_makes_the_names_share_one_parameter_again():
    model = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    retie_parameters(model, [["a.weight", "b.weight"]])
    assert model["b"].weight is model["a"].weight
    assert len(list(model.parameters())) == 3


def test_sizes_and_maps_as_accelerate_computes_them():
    assert convert_file_size_to_int("2GiB") == 2 * 2**30
    assert convert_file_size_to_int("100MB") == 100 * 10**6
    assert convert_file_size_to_int("8Mb") == 10**6  # bits
    with pytest.raises(ValueError, match="not in a valid format"):
        convert_file_size_to_int("12 apples")
    assert dtype_byte_size(torch.bfloat16) == 2 and dtype_byte_size(torch.bool) == 1 / 8
    device_map = {"a.0": 0, "a.1": 0, "b": "cpu"}
    assert clean_device_map(device_map) == {"a": 0, "b": "cpu"}
    buffers = nn.BatchNorm1d(2)
    buffers.register_buffer("scratch", torch.zeros(1), persistent=False)
    names = [name for name, _ in named_module_tensors(buffers, remove_non_persistent=True)]
    assert "scratch" not in names and "running_mean" in names


def test_versions_and_availability():
    import importlib.metadata

    torch_version = importlib.metadata.version("torch")
    assert is_torch_version("==", torch_version) and not is_torch_version("<", "1.0")
    assert compare_versions("torch", ">=", "1.0")
    with pytest.raises(ValueError, match="operation must be one of"):
        compare_versions("torch", "~=", "1.0")
    from drivetrain.utils import (
        is_cuda_available,
        is_pytest_available,
        is_torchdata_stateful_dataloader_available,
    )

    assert is_pytest_available() is True
    assert is_cuda_available() == torch.cuda.is_available()
    assert is_torchdata_stateful_dataloader_available() is True  # torchdata 0.11 is a dev dependency
