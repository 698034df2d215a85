"""What scripts written for Accelerate observe of prepared data loaders and samplers (issue 17's findings of
the peer suite; each test asserts what such a script observes)."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, TensorDataset

from drivetrain import Accelerator
from drivetrain.data.samplers import BatchSamplerShard


def test_batch_sampler_without_batch_size_pads_whole_batches_with_even_batches():
    batches = [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9, 10, 11], [12, 13]]
    shards = [BatchSamplerShard(batches, 2, rank, even_batches=True) for rank in range(2)]
    assert list(shards[0]) == [[0, 1, 2], [5, 6, 7, 8], [12, 13]]
    assert list(shards[1]) == [[3, 4], [9, 10, 11], [0, 1, 2]]
    assert len(shards[0]) == len(shards[1]) == 3
    three = [BatchSamplerShard([[0], [1, 2], [3], [4, 5]], 3, rank, even_batches=True) for rank in range(3)]
    assert [list(shard) for shard in three] == [[[0], [4, 5]], [[1, 2], [0]], [[3], [1, 2]]]
    with pytest.raises(ValueError, match="split_batches=True"):
        BatchSamplerShard(batches, 2, 0, split_batches=True)


def test_prepared_dataloaders_and_accelerator_pickle():
    accelerator = Accelerator(cpu=True)
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=2)
    prepared = accelerator.prepare(loader)
    restored = pickle.loads(pickle.dumps(prepared))
    assert [batch[0].tolist() for batch in restored] == [batch[0].tolist() for batch in prepared]
    restored_accelerator = pickle.loads(pickle.dumps(accelerator))
    assert len(restored_accelerator._dataloaders) == 1


def test_join_warns_for_single_process_and_iterable_loaders():
    accelerator = Accelerator(cpu=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([torch.nn.Linear(1, 1)], even_batches=False):
            pass
    assert any(issubclass(w.category, UserWarning) for w in caught)


def test_batch_sampler_shard_round_robin_still_exact():
    sampler = BatchSampler(range(10), batch_size=3, drop_last=False)
    shards = [list(BatchSamplerShard(sampler, 2, rank, even_batches=True)) for rank in range(2)]
    assert shards == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 0, 1]]]


@pytest.mark.parametrize(
    ("dispatch_batches", "stateful"),
    [(False, False), (True, False), (True, True)],
    ids=["shard", "dispatch", "dispatch-stateful"],
)
def test_resume_with_worker_processes_skips_the_consumed_batches(tmp_path, dispatch_batches, stateful):
    # torch's multi-worker iterator asks the index sampler for two iterators as it starts: the resume
    # position went to the discarded one, and the whole epoch came again (64 batches where 61 were left).
    pytest.importorskip("torchdata")
    from drivetrain.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(dispatch_batches=dispatch_batches, use_stateful_dataloader=stateful)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    data = TensorDataset(torch.arange(36))
    loader = accelerator.prepare(DataLoader(data, batch_size=3, shuffle=True, num_workers=2))
    rest = []
    for step, (batch,) in enumerate(loader):
        if step == 2:
            accelerator.save_state(tmp_path / "state")
        if step > 2:
            rest.append(batch.tolist())
    accelerator.load_state(tmp_path / "state")
    assert [batch.tolist() for (batch,) in loader] == rest
    assert len(rest) == 9


@pytest.mark.parametrize("cls_name", ["DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader"])
def test_loader_constructors_take_use_stateful_dataloader(cls_name):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    import drivetrain.data_loader as data_loader

    cls = getattr(data_loader, cls_name)
    extra = {"skip_batches": 2} if cls_name == "SkipDataLoader" else {}
    loader = cls(list(range(16)), batch_size=4, use_stateful_dataloader=True, **extra)
    assert isinstance(loader, cls) and isinstance(loader, stateful.StatefulDataLoader)
    assert loader.use_stateful_dataloader and loader.base_dataloader is loader
    expected = (
        [[8, 9, 10, 11], [12, 13, 14, 15]]
        if extra
        else [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    )
    assert [batch.tolist() for batch in loader] == expected
    assert not cls(list(range(4)), batch_size=2).use_stateful_dataloader


def test_a_sampler_yielding_batches_is_sharded_like_a_batch_sampler():
    from torch.utils.data import SequentialSampler, default_collate

    from drivetrain.data_loader import prepare_data_loader

    data = TensorDataset(torch.arange(10))
    shards = []
    for rank in range(2):
        sampler = BatchSampler(SequentialSampler(data), batch_size=2, drop_last=False)
        loader = DataLoader(data, sampler=sampler, batch_size=None, collate_fn=default_collate)
        prepared = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
        shards.append([batch[0].tolist() for batch in prepared])
    assert shards == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]


def test_a_loader_dropped_mid_epoch_is_collected_with_its_accelerator():
    import gc
    import weakref

    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare_data_loader(DataLoader(list(range(16)), batch_size=4))
    batches = iter(loader)
    assert next(batches).tolist() == [0, 1, 2, 3]
    assert loader.gradient_state.active_dataloader is loader
    assert loader.gradient_state.sync_gradients == accelerator.gradient_state.sync_gradients
    references = [weakref.ref(accelerator), weakref.ref(loader)]
    del accelerator, loader, batches
    gc.collect()
    assert [reference() for reference in references] == [None, None]


def test_base_dataloader_is_an_instance_attribute_as_in_accelerate():
    from drivetrain.data_loader import DataLoaderShard

    loader = DataLoaderShard(range(16), batch_size=4)
    assert isinstance(loader.base_dataloader, DataLoader)
    assert [batch.tolist() for batch in loader.base_dataloader][0] == [0, 1, 2, 3]
    assert not hasattr(DataLoaderShard, "base_dataloader")  # on the class it is not there, as in Accelerate


def test_an_iterable_dataset_with_enough_file_shards_gives_each_process_its_own_shards():
    datasets = pytest.importorskip("datasets")
    from drivetrain.data.samplers import IterableDatasetShard
    from drivetrain.data_loader import prepare_data_loader

    dataset = datasets.Dataset.from_dict({"x": list(range(10))}).to_iterable_dataset(num_shards=2)
    seen = []
    for rank in range(2):
        loader = prepare_data_loader(
            DataLoader(dataset, batch_size=4), num_processes=2, process_index=rank, dispatch_batches=False
        )
        assert not isinstance(loader.dataset, IterableDatasetShard)
        seen.append([x for batch in loader for x in batch["x"].tolist()])
    assert seen == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # whole shards, each read by one process only
    # fewer shards than processes: sample-level sharding, as before
    one_shard = datasets.Dataset.from_dict({"x": list(range(8))}).to_iterable_dataset(num_shards=1)
    loader = prepare_data_loader(
        DataLoader(one_shard, batch_size=2), num_processes=2, process_index=1, dispatch_batches=False
    )
    assert isinstance(loader.dataset, IterableDatasetShard)
