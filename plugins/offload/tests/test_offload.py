"""The offload plugin: cpu_offload, disk_offload, hook chains and a real transformers model across cpu+disk."""

from __future__ import annotations

import os

import pytest
import torch

import drivetrain
from drivetrain.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
from drivetrain_offload import (
    ModelHook,
    add_hook_to_module,
    align_module_device,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    has_offloaded_params,
    remove_hook_from_module,
    remove_hook_from_submodules,
)

torch.set_num_threads(1)


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()


X = torch.randn(4, 64)


def test_names_exported_from_drivetrain() -> None:
    assert drivetrain.cpu_offload is cpu_offload
    from drivetrain.big_modeling import AlignDevicesHook
    from drivetrain.big_modeling import disk_offload as exported

    assert exported is disk_offload and AlignDevicesHook.__name__ == "AlignDevicesHook"


def test_cpu_offload_same_output_and_weights_on_meta() -> None:
    model = _mlp(0)
    expected = model(X)
    cpu_offload(model, execution_device="cpu")
    assert model[0].weight.device.type == "meta" and has_offloaded_params(model[0])
    torch.testing.assert_close(model(X), expected, rtol=0, atol=0)
    with align_module_device(model[0]):
        torch.testing.assert_close(model[0](X), _mlp(0)[0](X), rtol=0, atol=0)
    assert model[0].weight.device.type == "meta"
    remove_hook_from_submodules(model)
    remove_hook_from_module(model)
    assert model[0].weight.device.type == "cpu"
    torch.testing.assert_close(model(X), expected, rtol=0, atol=0)


def test_disk_offload_reads_safetensors_folder(tmp_path) -> None:
    model = _mlp(1)
    expected = model(X)
    disk_offload(model, tmp_path, execution_device="cpu")
    assert (tmp_path / "index.json").is_file()
    assert [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    with torch.no_grad():
        for _ in range(3):  # later passes take the prefetched weights
            torch.testing.assert_close(model(X), expected, rtol=0, atol=0)
    assert model._drivetrain_prefetcher.hits >= 2


def test_cpu_offload_with_hook_chain() -> None:
    class Recorder(ModelHook):
        def __init__(self, log: list) -> None:
            self.log = log

        def pre_forward(self, module, *args, **kwargs):
            self.log.append(module)
            return args, kwargs

    models = [_mlp(2), torch.nn.Linear(8, 64).eval(), _mlp(3)]
    expected = models[2](models[1](models[0](X)))
    model_1, hook_1 = cpu_offload_with_hook(models[0], "cpu")
    model_2, hook_2 = cpu_offload_with_hook(models[1], "cpu", prev_module_hook=hook_1)
    model_3, hook_3 = cpu_offload_with_hook(models[2], "cpu", prev_module_hook=hook_2)
    offloaded: list = []
    hook_1.offload = lambda original=hook_1.offload: (offloaded.append(1), original())[1]  # type: ignore[method-assign]
    hid_1 = model_1(X)
    hid_2 = model_2(hid_1)
    assert offloaded == [1]  # model 1 went back to the CPU when model 2 ran
    torch.testing.assert_close(model_3(hid_2), expected, rtol=0, atol=0)
    hook_3.offload()
    log: list = []
    add_hook_to_module(model_3, Recorder(log), append=True)
    model_3(hid_2)
    assert log == [model_3]


def test_transformers_model_across_cpu_and_disk(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=100, n_positions=32)
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        expected = reference(ids).logits
    reference.save_pretrained(tmp_path / "ckpt", max_shard_size="100KB")
    assert (tmp_path / "ckpt" / "model.safetensors.index.json").is_file()
    with init_empty_weights():
        model = transformers.GPT2LMHeadModel(config).eval()
    model.tie_weights()
    device_map = {
        "transformer.wte": "cpu",
        "transformer.wpe": "cpu",
        "transformer.drop": "cpu",
        "transformer.h.0": "cpu",
        "transformer.h.1": "disk",
        "transformer.h.2": "disk",
        "transformer.h.3": "cpu",
        "transformer.ln_f": "disk",
        "lm_head": "cpu",
    }
    model = load_checkpoint_and_dispatch(
        model,
        tmp_path / "ckpt",
        device_map=device_map,
        offload_folder=tmp_path / "offload",
        no_split_module_classes=["GPT2Block"],
    )
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    # The same model with an inferred map that must offload to disk.
    with init_empty_weights():
        auto = transformers.GPT2LMHeadModel(config).eval()
    auto.tie_weights()
    auto = load_checkpoint_and_dispatch(
        auto,
        tmp_path / "ckpt",
        device_map="auto",
        max_memory={"cpu": "120KB"},
        offload_folder=tmp_path / "offload2",
        no_split_module_classes=["GPT2Block"],
    )
    assert "disk" in set(auto.hf_device_map.values()) and "cpu" in set(auto.hf_device_map.values())
    with torch.no_grad():
        torch.testing.assert_close(auto(ids).logits, expected, rtol=0, atol=0)


class _RecordingLinear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        object.__setattr__(self, "seen", self.weight)  # a plain attribute, not a registered parameter
        return super().forward(x)


class _SharedWeight(torch.nn.Module):
    """Uses its own parameter while the submodule holding the same (tied) parameter runs: both module
    hooks need the weight on the execution device at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _RecordingLinear(16, 16)
        self.scale = self.inner.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        object.__setattr__(self, "seen", self.scale)
        return self.inner(x) @ self.scale.T


def _tied_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), _SharedWeight()).eval()


def _count_reads(monkeypatch) -> list[str]:
    from drivetrain_offload.weights import OffloadedWeights

    reads: list[str] = []
    original = OffloadedWeights.__getitem__

    def counting(self, name):
        reads.append(name)
        return original(self, name)

    monkeypatch.setattr(OffloadedWeights, "__getitem__", counting)
    return reads


@pytest.mark.parametrize("where", ["disk", "cpu_offload"])
def test_tied_weight_is_onloaded_once_across_active_hooks(tmp_path, monkeypatch, where) -> None:
    from safetensors.torch import save_file

    from drivetrain_offload.module_hooks import AlignDevicesHook, hooks_of

    reference = _tied_model(7)
    x = torch.randn(3, 16)
    with torch.no_grad():
        expected = reference(x)
    if where == "disk":
        state = {k: v for k, v in reference.state_dict().items() if k != "1.scale"}
        save_file(state, tmp_path / "model.safetensors")
        with init_empty_weights():
            model = _tied_model(7)
        model[1].scale = model[1].inner.weight  # re-tie: init_empty_weights undoes ties, as Accelerate's
        model = load_checkpoint_and_dispatch(
            model,
            tmp_path / "model.safetensors",
            device_map={"0": "cpu", "1": "disk"},
            offload_folder=tmp_path / "offload",
        )
    else:
        model = cpu_offload(reference, execution_device="cpu")
    tied = {"1.scale", "1.inner.weight"}
    reads = _count_reads(monkeypatch)
    with torch.no_grad():
        for _ in range(2):
            reads.clear()
            torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
            # The outer hook brought the weight in; the inner hook took the same tensor...
            assert model[1].inner.seen is model[1].seen
            if where == "disk":  # ...and the file was read once (in memory, a lookup is no read)
                assert len([name for name in reads if name in tied]) == 1, reads
    hook = next(h for h in hooks_of(model[1]) if isinstance(h, AlignDevicesHook) and h.offload)
    assert len(hook.tied_params_map) == 1
    assert all(devices == {} for devices in hook.tied_params_map.values())  # released after forward
    assert model[1].scale.device.type == "meta"
