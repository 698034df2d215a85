"""File names drivetrain writes and reads, with the values Accelerate uses, so checkpoints are interchangeable."""

from __future__ import annotations

#: Model weights as a single pickled ``torch.save`` file.
WEIGHTS_NAME = "pytorch_model.bin"
#: Model weights as a single safetensors file.
SAFE_WEIGHTS_NAME = "model.safetensors"
#: Index of a sharded ``.bin`` checkpoint (``{"weight_map": {param_name: shard_file}}``).
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
#: Index of a sharded safetensors checkpoint.
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

#: Stems of the files ``Accelerator.save_state`` writes (an index suffix is added for the 2nd, 3rd... object).
MODEL_NAME = "pytorch_model"
OPTIMIZER_NAME = "optimizer"
RNG_STATE_NAME = "random_states"
SCALER_NAME = "scaler.pt"
SCHEDULER_NAME = "scheduler"

__all__ = [
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_STATE_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
]
