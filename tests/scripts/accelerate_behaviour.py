"""Behaviour scripts written for Accelerate rely on, on two real processes (issue 17). Launched by
tests/checkpoint/test_accelerate_checkpoint.py; prints "accelerate_behaviour OK rank=<r>".

- Each rank passes its own folder to save_state/load_state (a tempfile.TemporaryDirectory() per process, as
  Accelerate's test_distributed_data_loop.py does): the checkpoint is one, in the main process's folder, and
  every rank resumes its stateful data loader right after the batch it saved at.
- join_uneven_inputs warns (and does not join) when the state says the run is not plain data parallelism.
"""

from __future__ import annotations

import tempfile
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Accelerator
from drivetrain.config.enums import DistributedType
from drivetrain.utils import DataLoaderConfiguration


def main() -> None:
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    rank = accelerator.process_index
    data = TensorDataset(torch.arange(64 * accelerator.num_processes))
    loader = accelerator.prepare(DataLoader(data, batch_size=4, shuffle=True))
    with tempfile.TemporaryDirectory() as folder:  # a different folder on each rank
        rest = []
        for step, (batch,) in enumerate(loader):
            if step == 2:
                accelerator.save_state(folder)
            if step > 2:
                rest.append(batch)
        expected = accelerator.gather(torch.cat(rest))
        accelerator.load_state(folder)
        resumed = accelerator.gather(torch.cat([batch for (batch,) in loader]))
        assert torch.equal(expected, resumed), (expected.tolist(), resumed.tolist())
    accelerator.wait_for_everyone()

    original = accelerator.state.distributed_type
    accelerator.state.distributed_type = DistributedType.FSDP
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([torch.nn.Linear(1, 1)]):
            pass
    accelerator.state.distributed_type = original
    assert any("only supported for multi-GPU" in str(w.message) for w in caught), [
        str(w.message) for w in caught
    ]
    print(f"accelerate_behaviour OK rank={rank}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
