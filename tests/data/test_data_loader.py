"""Data sharding in one process: the shard classes are driven with num_processes / process_index set, so
every rank's share can be checked without starting processes (real ranks: test_data_loader_multiprocess)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset

from drivetrain.data_loader import (
    BatchSamplerShard,
    DataLoaderDispatcher,
    DataLoaderShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    prepare_data_loader,
    skip_first_batches,
)
from drivetrain.errors import CheckpointError
from drivetrain.state import GradientState


class Stream(IterableDataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        return iter(torch.arange(self.length).unsqueeze(1))

    def __len__(self) -> int:
        return self.length


def ids(batch) -> list[int]:
    tensor = batch[0] if isinstance(batch, (list, tuple)) else batch
    return tensor.flatten().tolist()


def shares(length, batch_size, n, split=False, even=True, drop_last=False, iterable=False, dispatch=False):
    """Each simulated rank's batches (as sample ids) and the loaders."""
    data = Stream(length) if iterable else TensorDataset(torch.arange(length))
    result, loaders = [], []
    for rank in range(n):
        loader = prepare_data_loader(
            DataLoader(data, batch_size=batch_size, drop_last=drop_last),
            num_processes=n,
            process_index=rank,
            split_batches=split,
            even_batches=even,
            dispatch_batches=dispatch,
        )
        result.append([ids(batch) for batch in loader])
        loaders.append(loader)
    return result, loaders


# -- exact shares, one case per mode --------------------------------------------------------------------------
def test_round_robin_even_batches_wraps_around_to_the_start():
    ranks, loaders = shares(10, 2, 2)
    assert ranks == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]
    assert [len(loader) for loader in loaders] == [3, 3]
    assert loaders[0].remainder == 2 and loaders[0].total_batch_size == 4


def test_round_robin_uneven_gives_the_rest_to_the_first_ranks():
    ranks, loaders = shares(10, 2, 2, even=False)
    assert ranks == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7]]]
    assert [len(loader) for loader in loaders] == [3, 2]


def test_split_batches_cuts_every_batch_and_pads_the_short_one():
    ranks, loaders = shares(10, 4, 2, split=True)
    assert ranks == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]
    assert loaders[1].total_batch_size == 4 and loaders[1].remainder == 2


def test_split_batches_uneven_leaves_the_last_rank_short():
    ranks, loaders = shares(9, 4, 2, split=True, even=False)
    assert ranks == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7]]]
    assert [len(loader) for loader in loaders] == [3, 2]


def test_drop_last_drops_the_incomplete_round():
    ranks, loaders = shares(11, 2, 2, drop_last=True)
    assert ranks == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert [len(loader) for loader in loaders] == [2, 2] and loaders[0].remainder == -1


def test_iterable_dataset_shard_takes_contiguous_slices_of_global_batches():
    ranks, loaders = shares(10, 2, 2, iterable=True)
    assert isinstance(loaders[0].dataset, IterableDatasetShard)
    assert ranks == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]
    assert loaders[0].remainder == 2


def test_dispatch_batches_process_zero_reads_and_every_rank_gets_a_slice():
    ranks, loaders = shares(10, 2, 2, dispatch=True)
    assert isinstance(loaders[0], DataLoaderDispatcher)
    # Global batches of 4 (two loader batches); the last 2 samples are split one per rank.
    assert ranks == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7], [9]]]
    assert loaders[0].total_batch_size == 4 and len(loaders[0]) == 3 and loaders[0].remainder == -1


def test_dispatch_pads_a_last_batch_that_does_not_divide():
    ranks, loaders = shares(9, 4, 2, split=True, dispatch=True)
    assert ranks == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7], [0]]]
    assert loaders[0].remainder == 1


def test_iterable_datasets_are_dispatched_by_default_with_several_processes():
    loader = prepare_data_loader(DataLoader(Stream(4), batch_size=2), num_processes=2, process_index=1)
    assert isinstance(loader, DataLoaderDispatcher)
    assert isinstance(prepare_data_loader(DataLoader(Stream(4), batch_size=2)), DataLoaderShard)


# -- invariants over many layouts --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "split,even,drop_last,iterable,dispatch",
    [
        (split, even, drop_last, iterable, dispatch)
        for split, even, drop_last, iterable, dispatch in itertools.product([False, True], repeat=5)
        if not (iterable and not even) and not (dispatch and not even)
    ],
)
def test_every_layout_covers_the_data_exactly_once(split, even, drop_last, iterable, dispatch):
    for length, batch_size, n in itertools.product([1, 5, 8, 13], [2, 4], [2, 3]):
        if split and batch_size % n:
            continue
        ranks, loaders = shares(length, batch_size, n, split, even, drop_last, iterable, dispatch)
        total = loaders[0].total_batch_size
        kept = length // total * total if drop_last else length
        counts = [len(batches) for batches in ranks]
        if not iterable:
            assert counts == [len(loader) for loader in loaders], (length, batch_size, n)
        if even or drop_last:
            assert len(set(counts)) == 1
            assert all(
                len({len(batch) for batch in step}) == 1 for step in zip(*ranks)
            )  # same sizes per step
        # Global order: step by step, rank by rank; the padding is what lies past the real samples.
        flat = [
            sample
            for step in itertools.zip_longest(*ranks, fillvalue=[])
            for batch in step
            for sample in batch
        ]
        remainder = loaders[0].remainder
        if remainder > 0:
            last = sum(len(step) for step in (r[-1] for r in ranks))
            flat = flat[: len(flat) - last + remainder]
        if drop_last:
            assert len(set(flat)) == len(flat) == kept
        else:
            assert sorted(flat) == list(range(length))


# -- the loader around the shards --------------------------------------------------------------------------------
def test_end_of_dataloader_is_true_only_while_the_last_batch_is_used_and_gradient_state_follows():
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(6)), batch_size=2))
    seen = []
    for _ in loader:
        assert GradientState().active_dataloader is loader
        seen.append((loader.end_of_dataloader, GradientState().end_of_dataloader))
    assert seen == [(False, False), (False, False), (True, True)]
    assert GradientState().active_dataloader is None


def test_breaking_out_of_a_loop_leaves_the_loader_registered_once_as_accelerate_does():
    # gather_for_metrics after a broken loop still sees the batch in use (Accelerate unregisters only at a
    # pass's natural end, one registration each)
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(6)), batch_size=2))
    for _ in range(2):
        for _ in loader:
            break
    assert GradientState().active_dataloader is loader
    assert GradientState().dataloader_references.count(loader) == 1


def test_batches_already_on_the_device_are_not_copied():
    data = TensorDataset(torch.arange(4))
    loader = prepare_data_loader(
        DataLoader(data, batch_size=2, collate_fn=lambda items: data.tensors[0]),
        put_on_device=True,
        device="cpu",
        non_blocking=True,
    )
    assert next(iter(loader)) is data.tensors[0]
    assert loader.device == torch.device("cpu") and loader.non_blocking


def test_custom_sampler_and_batch_sampler_are_kept():
    data = TensorDataset(torch.arange(8))
    reverse = list(range(7, -1, -1))
    loader = prepare_data_loader(
        DataLoader(data, batch_size=2, sampler=reverse), num_processes=2, process_index=0
    )
    assert [ids(batch) for batch in loader] == [[7, 6], [3, 2]]

    class Pairs(BatchSampler):
        def __init__(self):
            super().__init__(SequentialSampler(range(8)), 2, False)

        def __iter__(self):
            yield from ([i, i + 4] for i in range(4))

    loader = prepare_data_loader(DataLoader(data, batch_sampler=Pairs()), num_processes=2, process_index=1)
    assert isinstance(loader.batch_sampler, BatchSamplerShard)
    assert isinstance(loader.batch_sampler.batch_sampler, Pairs)
    assert [ids(batch) for batch in loader] == [[1, 5], [3, 7]]


def test_split_batches_that_do_not_divide_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match="batch size 3 is not a round multiple of the 2 processes"):
        prepare_data_loader(
            DataLoader(TensorDataset(torch.arange(8)), batch_size=3),
            num_processes=2,
            process_index=0,
            split_batches=True,
        )


def test_python_objects_are_dispatched_and_sliced():
    words = [f"w{i}" for i in range(5)]
    loader = prepare_data_loader(
        DataLoader(words, batch_size=2), num_processes=2, process_index=1, dispatch_batches=True
    )
    assert list(loader) == [["w2", "w3"], ["w0"]]  # the last global batch ["w4"] is padded with "w0"
    assert loader.remainder == 1


# -- skip_first_batches -----------------------------------------------------------------------------------------
def test_skip_first_batches_on_prepared_raw_and_iterable_loaders():
    data = TensorDataset(torch.arange(10))
    prepared = prepare_data_loader(DataLoader(data, batch_size=2), num_processes=2, process_index=0)
    skipped = skip_first_batches(prepared, 1)
    assert [ids(batch) for batch in skipped] == [[4, 5], [8, 9]] and len(skipped) == 2
    assert prepared.iteration == 1  # the original goes on with the next epoch

    raw = skip_first_batches(DataLoader(data, batch_size=4), 2)
    assert [ids(batch) for batch in raw] == [[8, 9]] and len(raw) == 1
    stream = skip_first_batches(DataLoader(Stream(6), batch_size=2), 1)
    assert [ids(batch) for batch in stream] == [[2, 3], [4, 5]]
    dispatched = skip_first_batches(
        prepare_data_loader(DataLoader(Stream(10), batch_size=2), num_processes=2, process_index=1), 1
    )
    assert [ids(batch) for batch in dispatched] == [[6, 7], [9]]


# -- seedable sampler ---------------------------------------------------------------------------------------------
def test_seedable_sampler_is_a_function_of_seed_and_epoch():
    def orders(seed):
        loader = prepare_data_loader(
            DataLoader(TensorDataset(torch.arange(16)), batch_size=4, shuffle=True),
            use_seedable_sampler=True,
            data_seed=seed,
        )
        assert isinstance(loader.batch_sampler.sampler, SeedableRandomSampler)
        return [[ids(batch) for batch in loader] for _ in range(3)], loader

    first, loader = orders(7)
    torch.manual_seed(1234)  # the global RNG plays no part
    second, _ = orders(7)
    assert first == second
    assert first[0] != first[1] != first[2]
    assert sorted(sum(first[1], [])) == list(range(16))
    loader.set_epoch(1)
    assert [ids(batch) for batch in loader] == first[1]
    assert orders(8)[0] != first


# -- resuming in a new loader ---------------------------------------------------------------------------------
def _fresh(kind: str, rank: int = 0):
    data = Stream(22) if kind == "iterable" else TensorDataset(torch.arange(22))
    return prepare_data_loader(
        DataLoader(data, batch_size=2, shuffle=kind == "shuffle"),
        num_processes=2,
        process_index=rank,
        use_stateful_dataloader=kind == "stateful",
        dispatch_batches=kind == "dispatch" or None,
    )


@pytest.mark.parametrize("kind", ["shuffle", "iterable", "dispatch", "stateful"])
def test_state_dict_resumes_mid_epoch_at_the_exact_sample_in_a_fresh_loader(kind):
    torch.manual_seed(0)
    loader = _fresh(kind)
    first_epoch = [ids(batch) for batch in loader]
    reference, saved = [], None
    for step, batch in enumerate(loader):  # epoch 1: save after three batches
        reference.append(ids(batch))
        if step == 2:
            saved = loader.resume_state()
    assert saved["epoch"] == 1 and saved["batches_yielded"] == 3
    torch.manual_seed(99)  # a new process: another global RNG, another loader object
    resumed = _fresh(kind)
    resumed.load_state_dict(saved)
    rest = [ids(batch) for batch in resumed]
    assert rest == reference[3:]
    assert resumed.iteration == loader.iteration == 2
    if kind == "shuffle":
        assert reference != first_epoch
    # A state taken between epochs starts the next epoch from its first batch.
    after = _fresh(kind)
    after.load_state_dict(loader.resume_state())
    assert [ids(batch) for batch in after] == [ids(batch) for batch in loader]
    if kind != "stateful":
        assert loader.state_dict().keys() == loader.resume_state().keys()


@pytest.mark.parametrize("cls", [DataLoaderShard, DataLoaderDispatcher], ids=["shard", "dispatcher"])
def test_stateful_state_dict_is_torchdata_state_and_resumes_like_it(cls):
    """What Accelerate's loaders promise with use_stateful_dataloader: state_dict() equals a plain
    StatefulDataLoader's after the same batches (also after a loop broken early), and its dict resumes them."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    data = list(range(40))

    def first_four(loader):
        seen = []
        for step, batch in enumerate(loader):
            seen.append(batch.tolist())
            if step == 3:
                break
        return seen

    plain = StatefulDataLoader(data, batch_size=4)
    ours = cls(data, batch_size=4, use_stateful_dataloader=True)
    assert first_four(ours) == first_four(plain)
    saved = plain.state_dict()
    assert ours.state_dict() == saved
    loaded = StatefulDataLoader(data, batch_size=4)
    loaded.load_state_dict(saved)
    rest = [batch.tolist() for batch in loaded]
    assert rest == [data[start : start + 4] for start in range(16, 40, 4)]
    resumed = cls(data, batch_size=4, use_stateful_dataloader=True)
    resumed.load_state_dict(saved)
    assert [batch.tolist() for batch in resumed] == rest
    # The resume record (what save_state writes) still carries the epoch and the position.
    assert resumed.resume_state()["epoch"] == 1 and ours.resume_state()["batches_yielded"] == 4

    # Shuffled: the dict a loader gives resumes a new one at the next batch.
    def shuffled():
        generator = torch.Generator().manual_seed(7)
        return cls(data, batch_size=4, shuffle=True, generator=generator, use_stateful_dataloader=True)

    epoch = [batch.tolist() for batch in shuffled()]
    ours = shuffled()
    assert first_four(ours) == epoch[:4]
    resumed = shuffled()
    resumed.load_state_dict(ours.state_dict())
    assert [batch.tolist() for batch in resumed] == epoch[4:]


def test_prepared_stateful_loader_resumes_from_its_state_dict():
    loader = _fresh("stateful")
    reference, saved = [], None
    for step, batch in enumerate(loader):
        reference.append(ids(batch))
        if step == 4:
            saved = loader.state_dict()
    assert "epoch" not in saved and saved["_num_yielded"] == 5
    resumed = _fresh("stateful")
    resumed.load_state_dict(saved)
    assert [ids(batch) for batch in resumed] == reference[5:]
    with pytest.raises(CheckpointError, match="missing batches_yielded, epoch"):
        resumed.load_state_dict({"something": 1})


def test_stateful_loaders_are_torchdata_stateful_dataloaders():
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = _fresh("stateful")
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader, DataLoaderShard)


def test_skip_first_batches_after_load_state_skips_once():
    torch.manual_seed(3)
    loader = _fresh("shuffle")
    reference, saved = [], None
    for step, batch in enumerate(loader):
        reference.append(ids(batch))
        if step == 3:
            saved = loader.state_dict()
    torch.manual_seed(5)
    resumed = _fresh("shuffle")
    resumed.load_state_dict(saved)  # what an Accelerate script does: load_state, then skip explicitly
    assert [ids(batch) for batch in skip_first_batches(resumed, 4)] == reference[4:]
    assert resumed.iteration == 1


def test_resuming_with_another_layout_is_refused():
    saved = _fresh("shuffle").state_dict()
    other = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(22)), batch_size=4), num_processes=2, process_index=0
    )
    with pytest.raises(CheckpointError, match="total_batch_size=4 but this loader has total_batch_size=8"):
        other.load_state_dict(saved)
    with pytest.raises(CheckpointError, match="missing batches_yielded"):
        other.load_state_dict({"epoch": 1})


def test_position_counts_per_epoch():
    loader = _fresh("shuffle")
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["batches_yielded"] == 2
    list(it)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches_yielded"]) == (1, 0)


def test_index_stream_fast_path_deals_exactly_like_the_generic_path():
    """torch's own BatchSampler takes a slicing fast path; any other batch sampler goes batch by batch.
    Both must hand every process the same batches, including the padded or dropped last round."""
    import itertools

    from torch.utils.data import BatchSampler, SequentialSampler

    from drivetrain.data.samplers import BatchSamplerShard

    class OtherBatchSampler(BatchSampler):  # same batches, but not torch's own class: generic path
        pass

    for length, size, processes, drop_last, even in itertools.product(
        range(0, 26), (1, 3, 4), (2, 3), (False, True), (False, True)
    ):
        sampler = SequentialSampler(range(length))
        for rank in range(processes):
            fast = BatchSamplerShard(
                BatchSampler(sampler, size, drop_last),
                num_processes=processes,
                process_index=rank,
                even_batches=even,
            )
            generic = BatchSamplerShard(
                OtherBatchSampler(sampler, size, drop_last),
                num_processes=processes,
                process_index=rank,
                even_batches=even,
            )
            assert list(fast) == list(generic), (length, size, processes, drop_last, even, rank)
            assert fast.final_real_samples == generic.final_real_samples
