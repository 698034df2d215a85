"""Property: gather_for_metrics returns exactly the N samples of the data, each once, in real processes.

Launched by tests/data/test_data_loader_multiprocess.py with 2 and 3 processes. Hypothesis runs derandomized and
without shrinking, so every rank draws the same examples in the same order (the collectives would hang
otherwise). Over: batch size, data length, split_batches, dispatch_batches, drop_last, map-style or
iterable data, tensors or Python objects (use_gather_object). Prints "data_gather_property OK rank=<r>".
"""

from __future__ import annotations

import sys

import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from drivetrain import Accelerator, DataLoaderConfiguration
from drivetrain.state import PartialState


class Stream(IterableDataset):
    def __init__(self, items: list) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)


def main(examples: int) -> None:
    world = PartialState().num_processes

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
    )
    @given(
        length=st.integers(1, 40),
        per_process=st.integers(1, 5),
        split_batches=st.booleans(),
        dispatch_batches=st.booleans(),
        drop_last=st.booleans(),
        iterable=st.booleans(),
        objects=st.booleans(),
    )
    def exact(length, per_process, split_batches, dispatch_batches, drop_last, iterable, objects):
        accelerator = Accelerator(
            dataloader_config=DataLoaderConfiguration(
                split_batches=split_batches, dispatch_batches=dispatch_batches
            )
        )
        batch_size = per_process * world if split_batches else per_process
        if objects:
            items = [f"s{i}" for i in range(length)]
            data = Stream(items) if iterable else items
        else:
            data = Stream(list(torch.arange(length))) if iterable else TensorDataset(torch.arange(length))
        loader = accelerator.prepare(DataLoader(data, batch_size=batch_size, drop_last=drop_last))
        gathered = []
        for batch in loader:
            if objects:
                gathered += accelerator.gather_for_metrics(list(batch), use_gather_object=True)
            else:
                ids = batch[0] if isinstance(batch, list) else batch
                gathered += accelerator.gather_for_metrics(ids).tolist()
        total = per_process * world
        expected = length // total * total if drop_last else length
        names = [f"s{i}" for i in range(length)] if objects else list(range(length))
        case = dict(
            world=world,
            length=length,
            batch_size=batch_size,
            split_batches=split_batches,
            dispatch_batches=dispatch_batches,
            drop_last=drop_last,
            iterable=iterable,
            objects=objects,
        )
        assert len(gathered) == expected, (case, gathered)
        assert len(set(gathered)) == expected and set(gathered) <= set(names), (case, gathered)
        accelerator.free_memory() if hasattr(accelerator, "free_memory") else None

    exact()
    print(f"data_gather_property OK rank={PartialState().process_index} world={world}", flush=True)
    PartialState().destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
