"""A sharded FSDP checkpoint whose DCP ``.metadata`` was replaced by a pickle that runs code, then one whose
metadata points a tensor at a file outside the checkpoint: load_state refuses each in one line, runs
nothing, reads nothing outside and leaves the model as it was.

Usage: fsdp_untrusted.py FOLDER (run on one process by the test)
"""

from __future__ import annotations

import os
import pickle
import sys

import torch
from fsdp_common import check, make_model

from drivetrain import Accelerator, FullyShardedDataParallelPlugin
from drivetrain.checkpoint import manifest as manifests
from drivetrain.errors import CheckpointError
from drivetrain.plugin_api.checkpoint import read_dcp_metadata


class RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def load_outcome(accelerator: Accelerator, folder: str) -> str:
    """Why load_state(folder) was refused, or "loaded"."""
    try:
        accelerator.load_state(folder)
    except CheckpointError as exc:
        return str(exc)
    return "loaded"


def main() -> None:
    torch.set_num_threads(1)
    folder = sys.argv[1]
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    model = make_model(seed=3)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    accelerator.save_state(folder)
    marker = os.path.join(folder, "..", "code_ran")
    for target in ("pytorch_model_fsdp_0/.metadata", "optimizer_0/.metadata"):
        with open(os.path.join(folder, target), "wb") as out:
            pickle.dump(RunsCode(marker), out)
    # The attacker hands over the whole folder, manifest included.
    os.remove(os.path.join(folder, manifests.MANIFEST_NAME))
    manifests.write_manifest(folder, {})
    before = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    message = load_outcome(accelerator, folder)
    check("sharded_metadata_refused", "pytorch_model_fsdp_0/.metadata was refused" in message, message)
    check("sharded_metadata_ran_nothing", not os.path.exists(marker), marker)
    after = model.state_dict()
    check("sharded_model_untouched", all(torch.equal(before[k], after[k].full_tensor()) for k in before), "")

    # A genuine sharded checkpoint whose model metadata names a shard of another checkpoint, outside it.
    outside = os.path.join(os.path.dirname(folder), "outside")
    accelerator.save_state(outside)
    accelerator.save_state(folder)
    metadata_folder = os.path.join(folder, "pytorch_model_fsdp_0")
    metadata = read_dcp_metadata(metadata_folder)
    for info in metadata.storage_data.values():
        info.relative_path = os.path.join(outside, "pytorch_model_fsdp_0", info.relative_path)
    with open(os.path.join(metadata_folder, ".metadata"), "wb") as out:
        pickle.dump(metadata, out)
    os.remove(os.path.join(folder, manifests.MANIFEST_NAME))
    manifests.write_manifest(folder, {})
    message = load_outcome(accelerator, folder)
    check("outside_path_refused", "outside the checkpoint folder: refused" in message, message)
    after = model.state_dict()
    check("outside_model_untouched", all(torch.equal(before[k], after[k].full_tensor()) for k in before), "")


if __name__ == "__main__":
    main()
