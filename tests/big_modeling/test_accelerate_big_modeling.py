"""What scripts written for Accelerate observe of device maps, offloading and quantized models (issue 17's
findings of the peer suite; each test asserts what such a script observes)."""

from __future__ import annotations

import warnings

import pytest
import torch

from drivetrain import Accelerator


class _ThreeLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(3, 4)  # 64 bytes
        self.batchnorm = torch.nn.BatchNorm1d(4)  # 72 bytes (with its running statistics)
        self.linear2 = torch.nn.Linear(4, 5)  # 100 bytes


def test_device_map_keeps_room_for_the_largest_layer_on_the_first_device():
    from drivetrain.big_modeling import infer_auto_device_map

    # Device 0 keeps 100 bytes for linear2 (offloaded layers visit it), so batchnorm starts device 1.
    assert infer_auto_device_map(_ThreeLayers(), max_memory={0: 200, 1: 200}) == {
        "linear1": 0,
        "batchnorm": 1,
        "linear2": 1,
    }
    stacked = torch.nn.Sequential(_ThreeLayers(), _ThreeLayers(), _ThreeLayers())
    assert infer_auto_device_map(stacked, max_memory={0: 500, 1: 500}) == {
        "0": 0,
        "1.linear1": 0,
        "1.batchnorm": 0,
        "1.linear2": 1,
        "2": 1,
    }
    kept = infer_auto_device_map(
        stacked, max_memory={0: 500, 1: 500}, no_split_module_classes=["_ThreeLayers"]
    )
    assert kept == {"0": 0, "1": 1, "2": 1}


def test_device_map_fallback_allocation_and_offloaded_buffer_warning(caplog):
    from collections import OrderedDict

    from drivetrain.big_modeling import infer_auto_device_map

    inner = torch.nn.Sequential(
        OrderedDict(
            [
                ("linear1", torch.nn.Linear(10, 4)),
                ("linear2", torch.nn.Linear(4, 4)),
                ("linear3", torch.nn.Linear(4, 8)),
            ]
        )
    )
    model = torch.nn.Sequential(OrderedDict([("module", inner)]))
    with caplog.at_level("INFO"):
        plain = infer_auto_device_map(model, max_memory={0: 256})
    assert set(plain.values()) == {"disk"} and "insufficient memory" in caplog.text
    fallback = infer_auto_device_map(model, max_memory={0: 256}, fallback_allocation=True)
    assert fallback == {"module.linear1": "disk", "module.linear2": 0, "module.linear3": "disk"}

    buffered = _ThreeLayers()
    buffered.batchnorm.register_buffer("extra", torch.zeros(10, 3))
    buffered.linear2.register_buffer("extra", torch.zeros(10, 3))
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        infer_auto_device_map(buffered, max_memory={0: 300, "cpu": "1GB"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        infer_auto_device_map(buffered, max_memory={0: 300, "cpu": "1GB"}, offload_buffers=True)


@pytest.mark.parametrize("multi_backend", [False, True])
@pytest.mark.parametrize("where", ["disk", "cpu"])
def test_a_quantized_model_offloaded_is_refused_unless_bitsandbytes_computes_on_the_cpu(
    monkeypatch, where, multi_backend
):
    import drivetrain.accelerator

    # Patched where Accelerate's tests patch it (and so bitsandbytes is not imported into this process: the
    # notebook launcher refuses to fork after it).
    monkeypatch.setattr(
        drivetrain.accelerator,
        "is_bitsandbytes_multi_backend_available",
        lambda: multi_backend,
        raising=False,
    )
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": where}
    if where == "cpu" and multi_backend:
        # As in Accelerate: a bitsandbytes built for several backends computes on the CPU, so CPU modules train.
        assert Accelerator(cpu=True).prepare_model(model) is not None
        return
    with pytest.raises(ValueError, match="CPU or disk offload"):
        Accelerator(cpu=True).prepare_model(model)


def test_device_map_entries_naming_nothing_warn_and_unused_checkpoint_weights_are_logged(tmp_path, caplog):
    from drivetrain.utils import check_device_map, load_checkpoint_in_model

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    with pytest.warns(UserWarning, match=r"device_map keys do not match any submodules.*'typo'"):
        check_device_map(model, {"0": "cpu", "1.weight": "cpu", "1.bias": "cpu", "typo": "cpu"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_device_map(model, {"": "cpu"})

    state = {**model.state_dict(), "extra": torch.ones(2)}
    path = tmp_path / "model.pt"
    torch.save(state, path)
    fresh = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    with caplog.at_level("WARNING"):
        load_checkpoint_in_model(fresh, path)
    assert "were not used when loading" in caplog.text and "extra" in caplog.text
    assert torch.equal(fresh[0].weight, model[0].weight)
    # strict: an error that is also torch's RuntimeError (load_state_dict raises one)
    with pytest.raises(RuntimeError, match="unexpected"):
        load_checkpoint_in_model(fresh, path, strict=True)


@pytest.mark.parametrize(
    ("devices", "multi_backend", "on_xpu", "refused"),
    [
        ({"": "cpu"}, False, False, True),  # the quantization library computes on accelerators only
        ({"": "cpu"}, True, False, False),  # a multi-backend build trains CPU modules
        ({"": "cpu"}, True, True, True),  # ... but not beside an XPU
        ({"a": "disk"}, True, False, True),  # disk offload is never trainable
    ],
)
def test_a_quantized_model_with_offloaded_modules_is_refused_unless_its_library_trains_on_cpu(
    monkeypatch, devices, multi_backend, on_xpu, refused
):
    import drivetrain.accelerator as accelerator_module

    # Accelerate's prepare_model asks these checks by these module names; scripts patch them there
    monkeypatch.setattr(accelerator_module, "is_bitsandbytes_multi_backend_available", lambda: multi_backend)
    monkeypatch.setattr(accelerator_module, "is_xpu_available", lambda: on_xpu)
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = devices
    accelerator = Accelerator(cpu=True)
    if refused:
        with pytest.raises(ValueError, match="CPU or disk offload"):
            accelerator.prepare_model(model)
    else:
        assert accelerator.prepare_model(model) is not None
