"""A damaged offload folder (index.json edited, a weight file moved) is one clear CheckpointError naming the
file and the entry, never a raw KeyError / JSONDecodeError from deep inside a forward (issue: hardening)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from drivetrain.plugin_api import CheckpointError
from drivetrain.plugin_api.big_model import load_offload_index
from drivetrain_offload.weights import OffloadedWeights


def _folder(tmp_path, index) -> str:
    folder = tmp_path / "offload"
    folder.mkdir()
    save_file({"w": torch.arange(4.0)}, folder / "weights.safetensors")
    (folder / "index.json").write_text(index if isinstance(index, str) else json.dumps(index))
    return str(folder)


GOOD = {"layer.weight": {"safetensors_file": "weights.safetensors", "weight_name": "w", "dtype": "float32"}}


def test_a_good_folder_reads_back(tmp_path):
    weights = OffloadedWeights(folder=_folder(tmp_path, GOOD))
    assert torch.equal(weights["layer.weight"], torch.arange(4.0))


@pytest.mark.parametrize(
    "index, message",
    [
        ("{not json", r"index\.json cannot be read \(JSONDecodeError"),
        ([1, 2], "is not a JSON object of weight entries"),
        ({"layer.weight": "weights.safetensors"}, r"entry 'layer\.weight': expected an object"),
        ({"layer.weight": {"weight_name": "w"}}, "'safetensors_file' must be a file name"),
        (
            {"layer.weight": {**GOOD["layer.weight"], "dtype": "float99"}},
            "'dtype' 'float99' is not a torch dtype",
        ),
    ],
    ids=["not-json", "not-object", "entry-not-object", "no-file", "bad-dtype"],
)
def test_a_damaged_index_is_one_clear_error(tmp_path, index, message):
    folder = _folder(tmp_path, index)
    with pytest.raises(CheckpointError, match=message) as caught:
        load_offload_index(folder)
    assert "load the checkpoint again" in str(caught.value) and "\n" not in str(caught.value)


def test_a_moved_weight_file_or_a_missing_tensor_names_the_weight(tmp_path):
    folder = _folder(
        tmp_path, {**GOOD, "other.weight": {"safetensors_file": "weights.safetensors", "weight_name": "x"}}
    )
    weights = OffloadedWeights(folder=folder)
    with pytest.raises(CheckpointError, match=r"'other\.weight': .* holds no tensor 'x'"):
        weights["other.weight"]
    os.remove(os.path.join(folder, "weights.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"'layer\.weight' is read from .*weights\.safetensors, which does not exist"
    ):
        OffloadedWeights(folder=folder)["layer.weight"]
