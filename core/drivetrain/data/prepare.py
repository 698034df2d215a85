"""``prepare_data_loader``: rebuild a user's DataLoader so that each process gets its share.

PyTorch does not let a DataLoader's sampler change after it is built, so the loader is rebuilt with the same
settings (workers, collate_fn, pin_memory, ...) around a sharded batch sampler, a sharded iterable dataset,
or, with ``dispatch_batches``, the original data read by process 0 alone. See docs/data-loading.md.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from drivetrain.contract.arguments import ShardingOptions
from drivetrain.data.loaders import (
    DataLoaderDispatcher,
    DataLoaderShard,
    _PreparedDataLoader,
    generator_of,
    stateful_variant,
)
from drivetrain.data.samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
)
from drivetrain.state import PartialState

#: The DataLoaderConfiguration settings that are sharding options too.
_SHARDING_SETTINGS = (
    "split_batches",
    "dispatch_batches",
    "even_batches",
    "use_seedable_sampler",
    "data_seed",
    "non_blocking",
    "use_stateful_dataloader",
)
#: DataLoader arguments that decide which samples are read; prepare_data_loader rebuilds those.
_SAMPLING_ARGUMENTS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


def _loader_settings(dataloader: DataLoader) -> dict[str, Any]:
    """The DataLoader arguments (other than sampling) of ``dataloader``, to build its replacement with."""
    names = [
        name
        for name in inspect.signature(DataLoader.__init__).parameters
        if name not in ("self", *_SAMPLING_ARGUMENTS)
    ]
    return {name: getattr(dataloader, name) for name in names if hasattr(dataloader, name)}


def _seedable(batch_sampler: Any, data_seed: int | None) -> Any:
    """``batch_sampler`` with its RandomSampler replaced by a SeedableRandomSampler (same settings)."""
    sampler = getattr(batch_sampler, "sampler", None)
    if not isinstance(sampler, RandomSampler) or isinstance(sampler, SeedableRandomSampler):
        return batch_sampler
    seedable = SeedableRandomSampler(
        sampler.data_source,
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        generator=sampler.generator,
        data_seed=data_seed,
    )
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(seedable, batch_sampler.batch_size, batch_sampler.drop_last)
    replaced = copy.copy(batch_sampler)  # a custom batch sampler: keep it, change what it draws from
    replaced.sampler = seedable
    return replaced


def _agree_on_seed(sampler: SeedableRandomSampler, state: PartialState | None) -> None:
    # Without data_seed each process would seed from its own torch seed: use process 0's.
    if state is not None and state.num_processes > 1:
        seed = [sampler.initial_seed]
        state.collectives.broadcast_object_list(seed, src=0)
        sampler.initial_seed = seed[0]


def sharding_options(
    config: Any, environment: Any, device: torch.device, rng_types: tuple[str, ...], put_on_device: bool
) -> ShardingOptions:
    """How a run cuts its data loaders (the ``options`` of ``shard_dataloader``): ``environment``'s
    data-parallel size and rank (a ``DistributedEnvironment``) and the settings of ``config`` (the
    Accelerator's ``DataLoaderConfiguration``)."""
    shares, share = environment.data_shards
    return ShardingOptions(
        device=device,
        num_processes=shares,
        process_index=share,
        put_on_device=put_on_device,
        rng_types=rng_types,
        **{name: getattr(config, name) for name in _SHARDING_SETTINGS},
    )


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[str] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
) -> DataLoader:
    """A loader over ``dataloader``'s data that yields this process's share of every batch.

    :param device: where batches go with ``put_on_device`` (default: ``PartialState().device``).
    :param num_processes: processes sharing the data (default: ``PartialState().num_processes``).
    :param process_index: this process's rank (default: ``PartialState().process_index``).
    :param split_batches: the loader's batch size is the global batch, cut into one slice per process;
        otherwise it is the per-process batch size and each process reads whole batches.
    :param put_on_device: move batches to ``device``.
    :param rng_types: generators to synchronise from process 0 at each epoch start ("generator" is the
        sampler's own, "torch", "cuda", ...).
    :param dispatch_batches: process 0 reads every batch and each process gets a slice (default: on for
        iterable datasets when several processes run).
    :param even_batches: complete the last batches by wrapping around to the start of the data so every
        process gets the same number of batches; False leaves them uneven (map-style datasets only).
    :param slice_fn_for_dispatch: ``fn(batch, slice, process_index=, num_processes=)`` that cuts a
        dispatched batch (default: slice every tensor and list of values along the first dimension).
    :param use_seedable_sampler: shuffle with :class:`SeedableRandomSampler` (order = f(data_seed, epoch)).
    :param data_seed: the seed of that sampler (default: process 0's ``torch.initial_seed()``).
    :param non_blocking: asynchronous device copies (useful with ``pin_memory=True``).
    :param use_stateful_dataloader: build on torchdata's ``StatefulDataLoader``.
    :return: a :class:`DataLoaderShard` or :class:`DataLoaderDispatcher`.
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"prepare_data_loader needs a torch.utils.data.DataLoader, got {type(dataloader).__name__}"
        )
    state = None
    if num_processes is None or process_index is None or (put_on_device and device is None):
        state = PartialState()
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
        device = state.device if device is None else device
    elif PartialState._shared_state:
        state = PartialState()
    if num_processes < 1 or not 0 <= process_index < num_processes:
        raise ValueError(
            f"process_index={process_index} with num_processes={num_processes}: the process index "
            f"must be in 0..{num_processes - 1}"
        )
    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = iterable and num_processes > 1
    settings = _loader_settings(dataloader)
    if settings.get("generator") is None:
        # Starting an iterator draws a base seed (for worker seeds) from the loader's generator, or from the
        # global RNG when it has none. That extra global draw would make a resumed run diverge from an
        # uninterrupted one (RNG states are restored before the new iterator starts), so the loader gets a
        # generator of its own, seeded once here from the global RNG.
        settings["generator"] = torch.Generator()
        settings["generator"].manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    common = {
        "device": device if put_on_device else None,
        "non_blocking": non_blocking,
        "rng_types": list(rng_types) if rng_types else None,
    }

    batch_sampler = dataloader.batch_sampler
    # DataLoader(dataset, sampler=BatchSampler(...), batch_size=None): the sampler yields whole batches of
    # indices (read with one dataset[indices] call); it is sharded like a batch sampler and stays the sampler.
    sampler_yields_batches = batch_sampler is None and isinstance(dataloader.sampler, BatchSampler)
    if sampler_yields_batches:
        batch_sampler = dataloader.sampler
    generator = None
    if not iterable and batch_sampler is not None:
        if use_seedable_sampler:
            batch_sampler = _seedable(batch_sampler, data_seed)
            sampler = getattr(batch_sampler, "sampler", None)
            if isinstance(sampler, SeedableRandomSampler) and data_seed is None:
                _agree_on_seed(sampler, state)
        sampler = getattr(batch_sampler, "sampler", None)
        if sampler is not None and hasattr(sampler, "generator") and sampler.generator is None:
            # A shuffle drawn from the global RNG cannot be replayed or synchronised by itself: give it its
            # own generator, seeded from the global RNG (so set_seed still decides the order).
            sampler.generator = torch.Generator()
            sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        generator = generator_of(batch_sampler)

    cls_shard = stateful_variant(DataLoaderShard) if use_stateful_dataloader else DataLoaderShard
    cls_dispatch = stateful_variant(DataLoaderDispatcher) if use_stateful_dataloader else DataLoaderDispatcher

    if dispatch_batches:
        if iterable:
            sampling = {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
        elif sampler_yields_batches:
            sampling = {"sampler": batch_sampler, "batch_size": None}
        else:
            sampling = {"batch_sampler": batch_sampler}
        return cls_dispatch(
            dataset,
            split_batches=split_batches,
            num_processes=num_processes,
            process_index=process_index,
            slice_fn=slice_fn_for_dispatch,
            synchronized_generator=generator,
            **common,
            **sampling,
            **settings,
        )

    if iterable:
        batch_size = dataloader.batch_size
        if num_processes > 1 and not split_batches and _shards_natively(dataset, num_processes):
            # a dataset of file shards (Hugging Face datasets' IterableDataset) gives each process whole
            # shards of its own, as Accelerate does: no process reads and drops the others' samples
            dataset = dataset.shard(num_shards=num_processes, index=process_index)
        elif num_processes > 1:
            if batch_size is None:
                raise ValueError(
                    "sharding an iterable dataset needs a DataLoader with a batch_size (it was None)"
                )
            dataset = IterableDatasetShard(
                dataset,
                batch_size=batch_size,
                drop_last=dataloader.drop_last,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
            )
            batch_size = dataset.process_batch_size
        return cls_shard(dataset, batch_size=batch_size, drop_last=dataloader.drop_last, **common, **settings)

    if batch_sampler is None:
        raise ValueError(
            "prepare_data_loader needs a DataLoader that batches (batch_size=None is not supported "
            "for map-style datasets); give it a batch_size or a batch_sampler"
        )
    if num_processes > 1:
        batch_sampler = BatchSamplerShard(
            batch_sampler,
            num_processes=num_processes,
            process_index=process_index,
            split_batches=split_batches,
            even_batches=even_batches,
        )
    sampling = (
        {"sampler": batch_sampler, "batch_size": None}
        if sampler_yields_batches
        else {"batch_sampler": batch_sampler}
    )
    return cls_shard(dataset, **sampling, synchronized_generator=generator, **common, **settings)


class SkipDataLoader(DataLoader):
    """A plain DataLoader over an iterable dataset that drops its first ``skip_batches`` batches
    (a StatefulDataLoader with ``use_stateful_dataloader=True``)."""

    _stateful = False

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> Any:
        if use_stateful_dataloader and not cls._stateful:
            cls = stateful_variant(cls)
        return super().__new__(cls)

    def __init__(
        self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches

    @property
    def use_stateful_dataloader(self) -> bool:
        return self._stateful

    @property
    def base_dataloader(self) -> DataLoader:
        return self

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)

    def __iter__(self) -> Any:
        for index, batch in enumerate(super().__iter__()):
            if index >= self.skip_batches:
                yield batch


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader that starts ``num_batches`` batches into ``dataloader``'s epoch (to resume mid-epoch).

    Map-style data is skipped in the sampler (no skipped sample is loaded); iterable data is read and
    dropped. A prepared loader's copy shares its sampler, and when it finishes the epoch the original loader
    goes on with the next one. It replaces a position loaded with ``load_state_dict``.
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}")
    if isinstance(dataloader, _PreparedDataLoader) or callable(getattr(dataloader, "skipping", None)):
        # a prepared loader, or a plugin's wrapper of one (the xla backend's device loader)
        return dataloader.skipping(num_batches)
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"skip_first_batches needs a DataLoader, got {type(dataloader).__name__}")
    settings = _loader_settings(dataloader)
    if isinstance(dataloader.dataset, IterableDataset) or dataloader.batch_sampler is None:
        sampler = None if isinstance(dataloader.dataset, IterableDataset) else dataloader.sampler
        return SkipDataLoader(
            dataloader.dataset,
            skip_batches=num_batches,
            batch_size=dataloader.batch_size,
            drop_last=dataloader.drop_last,
            sampler=sampler,
            **settings,
        )
    return DataLoader(
        dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches), **settings
    )


def _shards_natively(dataset: Any, num_processes: int) -> bool:
    """Whether ``dataset`` is made of at least ``num_processes`` shards it can hand out itself
    (``n_shards`` and ``shard(num_shards=, index=)``, as Hugging Face datasets' IterableDataset has)."""
    n_shards = getattr(dataset, "n_shards", None)
    return (
        isinstance(n_shards, int) and n_shards >= num_processes and callable(getattr(dataset, "shard", None))
    )
