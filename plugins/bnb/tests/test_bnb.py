"""drivetrain-bnb against the real bitsandbytes, on the CPU (its CPU backend quantizes and runs both layer kinds).

A small language-model-shaped network (embedding, two blocks of two linear layers, a norm, an output head) is
quantized in memory and from a safetensors checkpoint; the tests check which layers became bitsandbytes layers,
the dtypes of the others, the outputs against the float32 model, and that both ways give the same weights.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import os

import pytest
import torch
from torch import nn

if importlib.util.find_spec("bitsandbytes") is None:
    pytest.skip("bitsandbytes is not installed (pip install drivetrain-bnb)", allow_module_level=True)


def bnb():
    """bitsandbytes, imported when a test runs rather than when pytest collects this file: once it is imported,
    notebook_launcher refuses to fork (as Accelerate's does), and every test file is collected in one process."""
    return importlib.import_module("bitsandbytes")


from drivetrain import init_empty_weights  # noqa: E402
from drivetrain.utils import BnbQuantizationConfig, has_4bit_bnb_layers, load_and_quantize_model  # noqa: E402
from drivetrain.utils.bnb import (  # noqa: E402
    get_keys_to_not_convert,
    get_quantized_model_device_map,
    quantize_and_offload_8bit,
    replace_with_bnb_layers,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*quantize a loaded model.*")

#: Relative L2 error of the logits against the float32 model: 8-bit (LLM.int8, fp16 elsewhere) and 4-bit
#: (NF4 blocks of 64, computing in float32). Measured 0.16% and 3.6% (seeds 0-2, bitsandbytes 0.50.2 on the CPU).
INT8_TOLERANCE = 0.01
INT4_TOLERANCE = 0.08


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    """These tests are of bitsandbytes' CPU backend, also on a machine with a GPU (where the plugin would move
    models to it): the CUDA path is checked by gpu/check_bnb_cuda.py."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)


def _into(layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``hidden`` in the dtype of ``layer``'s floating weight (as transformers models cast before modules kept
    in another dtype); bitsandbytes layers take any floating input."""
    weight = layer.weight
    return hidden.to(weight.dtype) if weight.is_floating_point() else hidden


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        inner = torch.nn.functional.gelu(self.fc1(_into(self.fc1, hidden)))
        return hidden + self.fc2(_into(self.fc2, inner)).to(hidden.dtype)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 96, width: int = 128, tie: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.blocks(self.embed(ids))
        hidden = self.norm(_into(self.norm, hidden))
        return self.lm_head(_into(self.lm_head, hidden)).float()


QUANTIZED = ["blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2"]


@pytest.fixture
def reference():
    torch.manual_seed(0)
    model = TinyLM().eval()
    ids = torch.randint(0, 96, (4, 16))
    with torch.no_grad():
        expected = model(ids)
    return model, ids, expected


def _relative_error(output: torch.Tensor, expected: torch.Tensor) -> float:
    return ((output - expected).norm() / expected.norm()).item()


def _layer(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name)


def _config(bits: int, **kwargs) -> BnbQuantizationConfig:
    if bits == 8:
        return BnbQuantizationConfig(load_in_8bit=True, **kwargs)
    kwargs.setdefault("bnb_4bit_quant_type", "nf4")
    kwargs.setdefault("bnb_4bit_compute_dtype", "fp32")
    return BnbQuantizationConfig(load_in_4bit=True, **kwargs)


# --- the configuration ---------------------------------------------------------------------------------------


def test_config_defaults_follow_the_chosen_bits():
    eight = BnbQuantizationConfig(load_in_8bit=True)
    assert (eight.llm_int8_threshold, eight.torch_dtype, eight.target_dtype) == (
        6.0,
        torch.float16,
        torch.int8,
    )
    assert eight.skip_modules is None and eight.keep_in_fp32_modules is None
    four = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")
    assert four.bnb_4bit_compute_dtype == torch.bfloat16 and four.torch_dtype == torch.bfloat16
    assert four.bnb_4bit_quant_type == "fp4" and str(four.target_dtype) == "CustomDtype.INT4"
    assert BnbQuantizationConfig(load_in_8bit=True, torch_dtype="fp32").torch_dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"load_in_8bit": True, "load_in_4bit": True}, "load_in_8bit and load_in_4bit are both True"),
        ({}, "load_in_8bit and load_in_4bit are both False"),
        ({"load_in_8bit": 1}, r"load_in_8bit=1 is not valid; use True or False"),
        (
            {"load_in_4bit": True, "bnb_4bit_quant_type": "int4"},
            r"bnb_4bit_quant_type='int4'.*\['fp4', 'nf4'\]",
        ),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp64"}, r"bnb_4bit_compute_dtype='fp64'.*'bf16'"),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": 16}, r"bnb_4bit_compute_dtype=16"),
        ({"load_in_8bit": True, "torch_dtype": "half"}, r"torch_dtype='half' is not valid"),
        ({"load_in_8bit": True, "llm_int8_threshold": "6"}, r"llm_int8_threshold='6'.*a number"),
        ({"load_in_8bit": True, "skip_modules": "lm_head"}, r"skip_modules='lm_head'.*list of module names"),
        ({"load_in_8bit": True, "keep_in_fp32_modules": ("wo",)}, r"keep_in_fp32_modules=\('wo',\)"),
    ],
)
def test_config_refuses_bad_values_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BnbQuantizationConfig(**kwargs)


def test_config_warns_that_the_int8_threshold_does_nothing_in_4bit():
    with pytest.warns(UserWarning, match="llm_int8_threshold only applies to 8-bit"):
        BnbQuantizationConfig(load_in_4bit=True, llm_int8_threshold=3.0)


def test_names_resolve_from_accelerates_paths_to_the_plugin():
    import drivetrain.utils
    import drivetrain.utils.bnb
    import drivetrain.utils.dataclasses
    from drivetrain_bnb import config, quantize

    assert drivetrain.utils.dataclasses.BnbQuantizationConfig is config.BnbQuantizationConfig
    assert drivetrain.utils.load_and_quantize_model is quantize.load_and_quantize_model
    for name in (
        "load_and_quantize_model",
        "get_keys_to_not_convert",
        "get_parameter_device",
        "has_4bit_bnb_layers",
    ):
        assert getattr(drivetrain.utils.bnb, name) is getattr(quantize, name)


# --- choosing the layers ---------------------------------------------------------------------------------------


def test_keys_to_not_convert_are_the_head_and_the_tied_weights():
    assert get_keys_to_not_convert(TinyLM()) == ["lm_head"]
    assert get_keys_to_not_convert(TinyLM(tie=True)) == ["embed", "lm_head"]

    class BaseModel(TinyLM):  # a transformers base model: its base_model_prefix names no attribute of it
        base_model_prefix = "model"

    assert get_keys_to_not_convert(BaseModel()) == []


def test_replace_keeps_the_weights_and_skips_named_modules():
    model = TinyLM()
    fc1_weight = model.blocks[0].fc1.weight.detach().clone()
    replace_with_bnb_layers(model, _config(8), modules_to_not_convert=["lm_head", "blocks.1"])
    assert isinstance(model.blocks[0].fc1, bnb().nn.Linear8bitLt)
    assert torch.equal(model.blocks[0].fc1.weight.data, fc1_weight)  # not quantized before it is placed
    assert not model.blocks[0].fc1.weight.requires_grad
    assert type(model.blocks[1].fc1) is nn.Linear and type(model.lm_head) is nn.Linear


def test_replace_warns_when_no_linear_layer_is_left(caplog):
    replace_with_bnb_layers(nn.Sequential(nn.Linear(8, 8)), _config(8), modules_to_not_convert=["0"])
    assert "no torch.nn.Linear layer to quantize" in caplog.text


# --- quantizing a loaded model -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
def test_loaded_model_is_quantized_on_the_cpu_and_stays_close(reference, bits):
    model, ids, expected = reference
    config = _config(bits)
    quantized = load_and_quantize_model(copy.deepcopy(model), config)
    layer_class = bnb().nn.Linear8bitLt if bits == 8 else bnb().nn.Linear4bit
    for name in QUANTIZED:
        layer = _layer(quantized, name)
        assert isinstance(layer, layer_class), name
        assert layer.weight.dtype == (torch.int8 if bits == 8 else torch.uint8), name
    # the output head is skipped by default and kept, like every unquantized tensor, in torch_dtype
    assert config.skip_modules == ["lm_head"]
    assert type(quantized.lm_head) is nn.Linear and quantized.lm_head.weight.dtype == config.torch_dtype
    assert quantized.embed.weight.dtype == config.torch_dtype
    assert has_4bit_bnb_layers(quantized) is (bits == 4)
    assert quantized.is_loaded_in_8bit is (bits == 8) and quantized.is_loaded_in_4bit is (bits == 4)
    with torch.no_grad():
        output = quantized(ids)
    error = _relative_error(output, expected)
    assert error < (INT8_TOLERANCE if bits == 8 else INT4_TOLERANCE), error
    assert error > 0  # the weights really are quantized


def test_skip_modules_and_keep_in_fp32_modules_are_respected(reference):
    model, ids, expected = reference
    config = _config(8, skip_modules=["fc2"], keep_in_fp32_modules=["blocks.0.fc1", "norm"])
    quantized = load_and_quantize_model(copy.deepcopy(model), config)
    assert isinstance(quantized.blocks[1].fc1, bnb().nn.Linear8bitLt)
    for name in ("blocks.0.fc2", "blocks.1.fc2"):  # skipped: unquantized, in torch_dtype
        assert (
            type(_layer(quantized, name)) is nn.Linear
            and _layer(quantized, name).weight.dtype == torch.float16
        )
    assert type(quantized.blocks[0].fc1) is nn.Linear  # kept in float32, with the norm
    assert (
        quantized.blocks[0].fc1.weight.dtype == torch.float32 and quantized.norm.weight.dtype == torch.float32
    )
    assert isinstance(
        quantized.lm_head, bnb().nn.Linear8bitLt
    )  # an explicit skip_modules replaces the default
    with torch.no_grad():
        assert _relative_error(quantized(ids), expected) < INT8_TOLERANCE


def test_a_tied_weight_kept_in_fp32_is_fp32_under_both_names():
    model = TinyLM(tie=True)
    quantized = load_and_quantize_model(model, _config(8, keep_in_fp32_modules=["lm_head"]))
    assert (
        quantized.embed.weight is quantized.lm_head.weight and quantized.embed.weight.dtype == torch.float32
    )


# --- loading a checkpoint into a model built on the meta device ---------------------------------------------------


def _save(model: nn.Module, folder) -> str:
    from safetensors.torch import save_model

    path = os.path.join(folder, "model.safetensors")
    save_model(model, path)
    return path


def _quantized_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every bitsandbytes layer's quantized weight and its statistics, by name."""
    state = {}
    for name in QUANTIZED:
        layer = _layer(model, name)
        state[f"{name}.weight"] = layer.weight.data
        if isinstance(layer, bnb().nn.Linear8bitLt):
            state[f"{name}.SCB"] = layer.state.SCB if layer.weight.SCB is None else layer.weight.SCB
        else:
            state[f"{name}.absmax"] = layer.weight.quant_state.absmax
    return state


@pytest.mark.parametrize(("bits", "device_map"), [(8, None), (4, "auto")])
def test_checkpoint_gives_the_weights_of_quantizing_in_memory(reference, tmp_path, bits, device_map):
    model, ids, expected = reference
    path = _save(model, tmp_path)
    in_memory = load_and_quantize_model(copy.deepcopy(model), _config(bits))
    with init_empty_weights():
        empty = TinyLM()
    loaded = load_and_quantize_model(empty, _config(bits), weights_location=path, device_map=device_map)
    assert loaded.hf_device_map == {"": "cpu"}
    expected_state, loaded_state = _quantized_state(in_memory), _quantized_state(loaded)
    for name, tensor in expected_state.items():
        assert torch.equal(loaded_state[name], tensor), name
    assert torch.equal(loaded.lm_head.weight, in_memory.lm_head.weight)
    with torch.no_grad():
        assert torch.equal(loaded(ids), in_memory(ids))


def test_a_transformers_model_from_its_checkpoint(tmp_path):
    """A tiny Llama (random weights, tied embeddings) built on the meta device and loaded 8-bit from safetensors:
    every projection is an 8-bit layer, the tied head and embedding stay one fp16 tensor, logits within 2%
    (measured 0.63%)."""
    transformers = pytest.importorskip("transformers")

    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        expected = model(ids).logits
    path = _save(model, tmp_path)
    with init_empty_weights():
        empty = transformers.LlamaForCausalLM(config)
    empty.tie_weights()  # init_empty_weights undoes the tie made inside it, as Accelerate's does
    quantized = load_and_quantize_model(empty, _config(8), weights_location=path)
    projections = [
        name for name, module in quantized.named_modules() if isinstance(module, bnb().nn.Linear8bitLt)
    ]
    assert len(projections) == 2 * 7  # q, k, v, o, gate, up, down in each layer
    assert type(quantized.lm_head) is nn.Linear
    assert quantized.lm_head.weight is quantized.model.embed_tokens.weight
    assert quantized.lm_head.weight.dtype == torch.float16
    with torch.no_grad():
        assert _relative_error(quantized(ids).logits.float(), expected) < 0.02


def test_a_checkpoint_saved_from_an_8bit_model_loads_as_saved(reference, tmp_path):
    """Accelerate's int8 serialization: the state dict of a quantized model (int8 weights, their SCB scales)
    loads back into a model on the meta device without quantizing again."""
    from safetensors.torch import save_file

    model, ids, _ = reference
    quantized = load_and_quantize_model(copy.deepcopy(model), _config(8))
    with torch.no_grad():
        expected = quantized(
            ids
        )  # a forward moves the scales into the layer's state: saving still finds them
    state = quantized.state_dict()
    assert state["blocks.0.fc1.weight"].dtype == torch.int8 and "blocks.0.fc1.SCB" in state
    path = str(tmp_path / "int8.safetensors")
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, path)
    with init_empty_weights():
        empty = TinyLM()
    loaded = load_and_quantize_model(empty, _config(8), weights_location=path)
    for name in QUANTIZED:
        assert torch.equal(_layer(loaded, name).weight.data, state[f"{name}.weight"]), name
        assert torch.equal(_layer(loaded, name).weight.SCB, state[f"{name}.SCB"]), name
        assert not hasattr(_layer(loaded, name), "weight_format")
    with torch.no_grad():
        assert torch.equal(loaded(ids), expected)

    del state["blocks.1.fc2.SCB"]
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, path)
    with init_empty_weights():
        empty = TinyLM()
    with pytest.raises(
        ValueError, match=r"int8 weight for blocks.1.fc2 but not its scales \(blocks.1.fc2.SCB\)"
    ):
        load_and_quantize_model(empty, _config(8), weights_location=path)


def test_4bit_layers_a_dict_map_offloads_stay_unquantized(reference, tmp_path):
    model, ids, expected = reference
    path = _save(model, tmp_path)
    with init_empty_weights():
        empty = TinyLM()
    device_map = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "norm": "cpu", "lm_head": "cpu"}
    config = _config(4)
    loaded = load_and_quantize_model(
        empty, config, weights_location=path, device_map=device_map, offload_folder=str(tmp_path / "offload")
    )
    assert "blocks.1" in config.skip_modules
    assert isinstance(loaded.blocks[0].fc1, bnb().nn.Linear4bit)
    assert type(loaded.blocks[1].fc1) is nn.Linear  # offloaded to disk, unquantized
    with torch.no_grad():
        assert _relative_error(loaded(ids), expected) < INT4_TOLERANCE


def test_8bit_layers_on_disk_are_refused(reference, tmp_path):
    model, _, _ = reference
    path = _save(model, tmp_path)
    with init_empty_weights():
        empty = TinyLM()
    with pytest.raises(
        NotImplementedError, match=r"quantized layers \['blocks.1.fc1', 'blocks.1.fc2'\] on 'disk'"
    ):
        load_and_quantize_model(
            empty,
            _config(8),
            weights_location=path,
            device_map={
                "embed": "cpu",
                "blocks.0": "cpu",
                "blocks.1": "disk",
                "norm": "cpu",
                "lm_head": "cpu",
            },
            offload_folder=str(tmp_path / "offload"),
        )


def test_a_model_on_meta_needs_weights_location():
    with init_empty_weights():
        empty = TinyLM()
    with pytest.raises(ValueError, match="weights_location must name its checkpoint"):
        load_and_quantize_model(empty, _config(8))


def test_device_map_strategies_are_checked_and_sized_quantized():
    with init_empty_weights():
        model = replace_with_bnb_layers(TinyLM(), _config(4), modules_to_not_convert=["lm_head"])
    config = _config(4, skip_modules=["lm_head"], keep_in_fp32_modules=[])
    with pytest.raises(ValueError, match=r"device_map='fastest' is not valid.*'balanced_low_0'"):
        get_quantized_model_device_map(model, config, "fastest")
    with pytest.raises(ValueError, match=r"offloads the modules \['blocks'\], which would hold 4-bit"):
        get_quantized_model_device_map(model, config, {"embed": 0, "blocks": "cpu", "norm": 0, "lm_head": 0})
    assert get_quantized_model_device_map(model, config, "sequential") == {"": "cpu"}


def test_quantize_and_offload_8bit_writes_int8_weights_and_their_statistics(tmp_path):
    import numpy

    model = replace_with_bnb_layers(nn.Sequential(nn.Linear(64, 32)), _config(8))
    weight = torch.randn(32, 64)
    index: dict = {}
    quantize_and_offload_8bit(model, weight, "0.weight", torch.float16, str(tmp_path), index, None)
    assert index == {
        "0.weight": {"dtype": "int8", "shape": [32, 64]},
        "0.SCB": {"dtype": "float32", "shape": [32]},
    }
    written = numpy.memmap(tmp_path / "0.weight.dat", dtype="int8", mode="r", shape=(32, 64))
    statistics = numpy.memmap(tmp_path / "0.SCB.dat", dtype="float32", mode="r", shape=(32,))
    expected, expected_statistics, _ = bnb().functional.int8_vectorwise_quant(weight.half())
    assert torch.equal(torch.from_numpy(written.copy()), expected)
    assert torch.equal(torch.from_numpy(statistics.copy()), expected_statistics)
    assert model[0].weight.device.type == "meta"
