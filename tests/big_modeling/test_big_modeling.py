"""Big model inference: every example of the seeds gives the outputs of the normally loaded model."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from drivetrain.big_modeling import (
    compute_module_sizes,
    dispatch_model,
    get_balanced_memory,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    parse_size,
)
from drivetrain.big_modeling.sizes import largest_leaf_size
from drivetrain.errors import CheckpointError

torch.set_num_threads(1)


class Block(torch.nn.Module):
    """A residual block: must never be split across devices."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.linear1 = torch.nn.Linear(width, width)
        self.linear2 = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear2(torch.relu(self.linear1(self.norm(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 50, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _empty_tiny_lm(**sizes: int) -> TinyLM:
    """TinyLM's skeleton on the meta device, re-tied after init_empty_weights (which undoes ties made inside
    it, as Accelerate's does; transformers' ``model.tie_weights()`` is the same step)."""
    with init_empty_weights():
        model = TinyLM(**sizes)
    model.head.weight = model.embed.weight
    return model


def _reference(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM().eval()


def _save_sharded(model: torch.nn.Module, folder: str, shards: int = 3) -> str:
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}
    names = list(state)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i:05d}.safetensors"
        part = {n: state[n] for n in names[i * per : (i + 1) * per]}
        if part:
            save_file(part, os.path.join(folder, file))
            weight_map.update({n: file for n in part})
    import json

    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    return folder


IDS = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])


def test_parse_size() -> None:
    assert parse_size("10GiB") == 10 * 2**30
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size(123) == 123
    with pytest.raises(ValueError, match="10GiB"):
        parse_size("ten gigs")


def test_init_empty_weights_costs_nothing_and_unties_as_accelerate() -> None:
    with init_empty_weights():
        model = torch.nn.Sequential(*[torch.nn.Linear(10000, 10000) for _ in range(100)])
        lm = TinyLM()
    assert all(p.device.type == "meta" for p in model.parameters())
    # Accelerate's init_empty_weights gives every registration its own parameter: a tie made inside the block
    # is undone (transformers' model.tie_weights() makes it again)
    assert lm.head.weight is not lm.embed.weight
    assert lm.head.weight.device.type == "meta"
    lm.head.weight = lm.embed.weight
    assert lm.head.weight is lm.embed.weight  # outside the block, assignment ties as usual
    assert compute_module_sizes(model)[""] == 100 * (10000 * 10000 + 10000) * 4
    with init_on_device("meta", include_buffers=True):
        norm = torch.nn.BatchNorm1d(4)
    assert norm.running_mean.device.type == "meta"


def test_sizes_count_quantized_weights_at_their_width() -> None:
    """Accelerate's ``CustomDtype`` sizes (quantization plugins size 4-bit layers with ``CustomDtype.INT4``)."""
    from drivetrain.utils.dataclasses import CustomDtype

    with init_empty_weights():
        layer = torch.nn.Linear(64, 32)
    assert compute_module_sizes(layer, dtype=CustomDtype.INT4)[""] == (64 * 32 + 32) // 2
    sizes = compute_module_sizes(layer, dtype=CustomDtype.INT2, special_dtypes={"bias": torch.float16})
    assert (sizes["weight"], sizes["bias"]) == (64 * 32 // 4, 32 * 2)


def test_auto_map_cpu_and_disk_same_logits(tmp_path) -> None:
    reference = _reference()
    expected = reference(IDS)
    checkpoint = _save_sharded(reference, str(tmp_path))
    model = _empty_tiny_lm()
    sizes = compute_module_sizes(model)
    model = load_checkpoint_and_dispatch(
        model,
        checkpoint,
        device_map="auto",
        # Room for the embedding (tied head) and two blocks, plus the largest layer, kept free so that
        # disk-offloaded weights can visit the CPU while they run.
        max_memory={"cpu": 2 * sizes["embed"] + 2 * sizes["blocks.0"]},
        no_split_module_classes=["Block"],
        offload_folder=str(tmp_path / "offload"),
        prefetch=True,  # off by default on the CPU; exercised here
    )
    assert model.hf_device_map == {
        "embed": "cpu",
        "blocks.0": "cpu",
        "blocks.1": "cpu",
        "blocks.2": "disk",
        "blocks.3": "disk",
        "head": "cpu",
    }, model.hf_device_map
    # No Block is cut in two, and the tied head goes where the embedding goes.
    for name in model.hf_device_map:
        assert not any(name.startswith(f"blocks.{i}.") for i in range(4)), name
    assert model.hf_device_map.get("head", model.hf_device_map.get("embed")) == model.hf_device_map["embed"]
    # Disk weights are referenced inside the checkpoint, not copied.
    assert not [f for f in os.listdir(tmp_path / "offload") if f.endswith(".safetensors")]
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), expected, rtol=0, atol=0)
        torch.testing.assert_close(
            model(IDS), expected, rtol=0, atol=0
        )  # second pass uses prefetched weights
    assert model._drivetrain_prefetcher.hits > 0


def test_hand_made_map_with_param_entries_and_bin_checkpoint(tmp_path) -> None:
    reference = _reference(1)
    expected = reference(IDS)
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    model = _empty_tiny_lm()
    device_map = {
        "embed": "cpu",
        "head": "cpu",
        "blocks.0": "disk",
        "blocks.1": "cpu",
        "blocks.2.norm": "disk",
        "blocks.2.linear1": "cpu",
        "blocks.2.linear2.weight": "disk",
        "blocks.2.linear2.bias": "cpu",
        "blocks.3": "disk",
    }
    model = load_checkpoint_and_dispatch(
        model, str(tmp_path), device_map=device_map, offload_folder=str(tmp_path / "off")
    )
    # .bin weights for the disk are written once, as safetensors.
    assert [f for f in os.listdir(tmp_path / "off") if f.endswith(".safetensors")]
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), expected, rtol=0, atol=0)


def test_sequential_and_balanced_on_cpu_only(tmp_path) -> None:
    reference = _reference(2)
    checkpoint = _save_sharded(reference, str(tmp_path))
    for strategy in ("sequential", "balanced", "balanced_low_0", "auto"):
        model = _empty_tiny_lm()
        model = load_checkpoint_and_dispatch(model, checkpoint, device_map=strategy)
        assert model.hf_device_map == {"": "cpu"}
        torch.testing.assert_close(model(IDS), reference(IDS), rtol=0, atol=0)
    with pytest.raises(ValueError, match="balanced_low_0"):
        load_checkpoint_and_dispatch(TinyLM(), checkpoint, device_map="fastest")


def test_balanced_memory_splits_evenly() -> None:
    model = TinyLM(width=64)
    memory = get_balanced_memory(model, {0: "1GB", 1: "1GB", "cpu": "1GB"}, no_split_module_classes=["Block"])
    total = compute_module_sizes(model)[""]
    assert memory[0] < total and memory[1] < total and memory[0] == memory[1]
    device_map = infer_auto_device_map(model, memory, no_split_module_classes=["Block"])
    assert set(device_map.values()) == {0, 1}
    low = get_balanced_memory(model, {0: "1GB", 1: "1GB"}, no_split_module_classes=["Block"], low_zero=True)
    assert low[0] < low[1]


def test_no_split_module_classes_respected() -> None:
    model = TinyLM(width=32)
    sizes = compute_module_sizes(model)
    block = sizes["blocks.0"]
    # Room for all but one and a half blocks, plus the room the CPU keeps for the largest layer.
    budget = sizes[""] - 2 * block + block // 2 + largest_leaf_size(model, sizes)
    split = infer_auto_device_map(model, {"cpu": budget})
    kept = infer_auto_device_map(model, {"cpu": budget}, no_split_module_classes=["Block"])
    assert any(name.startswith("blocks.") and name.count(".") >= 2 for name in split)
    assert all(name.count(".") <= 1 for name in kept), kept


def test_dtype_and_keep_in_fp32(tmp_path) -> None:
    reference = _reference(3)
    save_file(
        {k: v for k, v in reference.state_dict().items() if k != "head.weight"},
        tmp_path / "model.safetensors",
    )
    model = _empty_tiny_lm()
    load_checkpoint_in_model(model, str(tmp_path), dtype=torch.float16, keep_in_fp32_modules=["norm"])
    assert model.blocks[0].linear1.weight.dtype == torch.float16
    assert model.blocks[0].norm.weight.dtype == torch.float32
    assert model.head.weight is model.embed.weight
    torch.testing.assert_close(model.blocks[1].linear2.weight, reference.blocks[1].linear2.weight.half())


def test_strict_and_truncated_checkpoint(tmp_path) -> None:
    reference = _reference(4)
    save_file(
        {"embed.weight": reference.embed.weight.detach(), "extra": torch.zeros(1)},
        tmp_path / "model.safetensors",
    )
    model = _empty_tiny_lm()
    with pytest.raises(CheckpointError, match="missing.*blocks.0.norm.weight.*unexpected.*extra"):
        load_checkpoint_in_model(model, str(tmp_path / "model.safetensors"), strict=True)
    result = load_checkpoint_in_model(model, str(tmp_path / "model.safetensors"))
    assert result.unexpected_keys == ["extra"] and "blocks.0.norm.weight" in result.missing_keys
    full = tmp_path / "full.safetensors"
    save_file({k: v for k, v in reference.state_dict().items() if k != "head.weight"}, full)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated.safetensors"):
        load_checkpoint_in_model(TinyLM(), str(truncated))
    torch.save(reference.state_dict(), tmp_path / "full.bin")
    (tmp_path / "cut.bin").write_bytes((tmp_path / "full.bin").read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="cut.bin"):
        load_checkpoint_in_model(TinyLM(), str(tmp_path / "cut.bin"))


def test_dispatch_model_on_loaded_model_writes_disk_weights(tmp_path) -> None:
    model = _reference(5)
    expected = model(IDS)
    device_map = {"embed": "cpu", "blocks": "disk", "head": "cpu"}
    model = dispatch_model(model, device_map, offload_dir=str(tmp_path))
    assert model.blocks[0].linear1.weight.device.type == "meta"
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), expected, rtol=0, atol=0)


def test_missing_plugin_says_how_to_install(monkeypatch) -> None:
    from drivetrain.contract.registry import reset_plugin_registry

    monkeypatch.setenv("DRIVETRAIN_LOAD_PLUGINS", "local")
    reset_plugin_registry()
    try:
        with pytest.raises(Exception, match="pip install drivetrain-offload"):
            dispatch_model(
                _reference(), {"embed": "cpu", "blocks": "disk", "head": "cpu"}, offload_dir="/tmp"
            )
        model = dispatch_model(_reference(), {"": "cpu"})  # one device: the reference backend does it
        assert model.hf_device_map == {"": "cpu"}
    finally:
        monkeypatch.delenv("DRIVETRAIN_LOAD_PLUGINS")
        reset_plugin_registry()


def test_mapped_and_copied_loads_are_byte_identical(tmp_path) -> None:
    reference = _reference(6)
    checkpoint = _save_sharded(reference, str(tmp_path))
    expected = reference.state_dict()
    for map_weights in (True, False):
        model = _empty_tiny_lm()
        load_checkpoint_in_model(model, checkpoint, map_weights=map_weights, strict=False)
        for name, tensor in model.state_dict().items():
            assert torch.equal(tensor, expected[name]), name
        assert model.head.weight is model.embed.weight
        weight = model.blocks[0].linear1.weight
        # One storage per tensor, not a view of a whole shard: saving a weight saves only its bytes.
        assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
        with torch.no_grad():
            weight.add_(1.0)  # a mapped weight is copy-on-write: the checkpoint is not modified
    again = _empty_tiny_lm()
    load_checkpoint_in_model(again, checkpoint)
    assert torch.equal(again.blocks[0].linear1.weight, expected["blocks.0.linear1.weight"])


def test_reader_chunks_and_casts_are_exact(tmp_path) -> None:
    from drivetrain.safetensors_reader import TensorReader, read_header

    torch.manual_seed(0)
    tensors = {"a": torch.randn(1000, 37), "b": torch.randint(0, 100, (4099,), dtype=torch.int64)}
    path = str(tmp_path / "t.safetensors")
    save_file(tensors, path)
    records = read_header(path)
    assert list(records) == sorted(records, key=lambda k: records[k].start)
    direct = {name: torch.empty(r.shape, dtype=r.dtype) for name, r in records.items()}
    cast = torch.empty(1000, 37, dtype=torch.bfloat16)
    strided = torch.empty(37, 1000).t()  # an existing non-contiguous tensor, filled in place
    with TensorReader(workers=2, chunk_bytes=4096 + 8) as reader:  # many uneven chunks
        for name, record in records.items():
            reader.read(path, record, direct[name], name)
        reader.read(path, records["a"], cast, "a")
        reader.read(path, records["a"], strided, "a")
        reader.wait()
    assert torch.equal(direct["a"], tensors["a"]) and torch.equal(direct["b"], tensors["b"])
    assert torch.equal(cast, tensors["a"].to(torch.bfloat16))
    assert torch.equal(strided, tensors["a"])


def test_damaged_header_and_8bit_offload_are_clear_errors(tmp_path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((10**9).to_bytes(8, "little") + b"{}")
    model = _empty_tiny_lm()
    with pytest.raises(CheckpointError, match="bad.safetensors.*damaged or truncated"):
        load_checkpoint_in_model(model, str(bad))
    with pytest.raises(NotImplementedError, match="offload_8bit_bnb.*bitsandbytes"):
        load_checkpoint_in_model(model, str(bad), offload_8bit_bnb=True)


def test_saving_over_the_checkpoint_a_mapped_model_came_from_keeps_its_weights(tmp_path) -> None:
    # A loaded CPU weight shares pages with its checkpoint file; the common "load, use, save back to the same
    # folder" must neither corrupt the live weights nor crash (save_model replaces files, never rewrites them).
    from drivetrain import Accelerator

    accelerator = Accelerator(cpu=True)
    reference = _reference(7)
    accelerator.save_model(reference, str(tmp_path), max_shard_size="20KB")
    expected = {name: tensor.clone() for name, tensor in reference.state_dict().items()}
    model = _empty_tiny_lm()
    model = load_checkpoint_and_dispatch(model, str(tmp_path), device_map={"": "cpu"})
    logits = model(IDS)

    torch.manual_seed(99)
    accelerator.save_model(TinyLM(), str(tmp_path), max_shard_size="20KB")  # other weights, same file names
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert torch.equal(model(IDS), logits)
