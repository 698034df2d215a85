"""Every sharding mode in real processes: the ranks' samples, put together, cover the data exactly once.

Launched by tests/data/test_data_loader_multiprocess.py. Each rank seeds torch differently, so shuffled modes only
agree because the sampler's generator is synchronised from rank 0 at each epoch (rng_types=["generator"]).
Prints "data_sharding OK rank=<r>".
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from drivetrain.data_loader import DataLoaderDispatcher, prepare_data_loader
from drivetrain.state import PartialState


class Stream(IterableDataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        return iter(torch.arange(self.length))


def main() -> None:
    state = PartialState()
    rank, world = state.process_index, state.num_processes
    torch.manual_seed(1000 + rank)  # deliberately different: shuffles must still agree
    length = 23
    modes = [
        dict(),
        dict(shuffle=True),
        dict(shuffle=True, split_batches=True),
        dict(even_batches=False),
        dict(drop_last=True, shuffle=True),
        dict(iterable=True, dispatch_batches=False),
        dict(iterable=True),  # dispatched by default
        dict(dispatch_batches=True, shuffle=True),
        dict(dispatch_batches=True, split_batches=True),
        dict(shuffle=True, use_seedable_sampler=True),
    ]
    for mode in modes:
        mode = dict(mode)
        iterable, shuffle, drop_last = (
            mode.pop("iterable", False),
            mode.pop("shuffle", False),
            mode.pop("drop_last", False),
        )
        data = Stream(length) if iterable else TensorDataset(torch.arange(length))
        loader = prepare_data_loader(
            DataLoader(data, batch_size=4, shuffle=shuffle, drop_last=drop_last),
            rng_types=["generator"],
            **mode,
        )
        if mode.get("dispatch_batches", iterable and mode.get("dispatch_batches") is None):
            assert isinstance(loader, DataLoaderDispatcher), mode
        for epoch in range(2):
            mine = []
            for batch in loader:
                ids = batch[0] if isinstance(batch, list) else batch
                mine.append(ids.tolist())
            everyone = state.collectives.all_gather_object((mine, loader.remainder))
            if mode.get("even_batches", True) or drop_last:
                assert len({len(batches) for batches, _ in everyone}) == 1, (mode, everyone)
            steps = [
                [batches[i] for batches, _ in everyone if i < len(batches)]
                for i in range(max(len(batches) for batches, _ in everyone))
            ]
            flat = [sample for step in steps[:-1] for batch in step for sample in batch]
            last = [sample for batch in steps[-1] for sample in batch]
            remainder = everyone[0][1]
            flat += last[:remainder] if remainder > 0 else last
            total = loader.total_batch_size
            if drop_last:
                assert len(flat) == len(set(flat)) == length // total * total, (mode, flat)
            else:
                assert sorted(flat) == list(range(length)), (mode, epoch, sorted(flat))
            if shuffle and epoch == 0:
                first_epoch = flat
            elif shuffle:
                assert flat != first_epoch, mode
    print(f"data_sharding OK rank={rank} world={world}", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
