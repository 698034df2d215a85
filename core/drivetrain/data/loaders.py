"""Prepared data loaders: :class:`DataLoaderShard` (every process reads its own share) and
:class:`DataLoaderDispatcher` (process 0 reads, every process gets a slice).

Both are ``torch.utils.data.DataLoader`` subclasses (``StatefulDataLoader`` ones with
``use_stateful_dataloader``) and add what a training loop relies on:

- one batch of look-ahead, so ``end_of_dataloader`` is True while the last batch is being used and
  ``remainder`` tells ``gather_for_metrics`` how many samples of the last global batch are real;
- registration with ``GradientState`` while iterating;
- random state synchronised across processes at the start of every epoch (``rng_types``);
- batches moved to the device (``non_blocking`` on request; batches already there are not touched);
- ``resume_state`` / ``load_state_dict`` giving the position (epoch, batches used, the shuffle's generator
  state at the start of the epoch), so a new process resumes at the exact sample; ``state_dict`` is that
  record too, except on a stateful loader, where it is torchdata's ``StatefulDataLoader`` state, as in
  Accelerate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from drivetrain.data.batches import batch_length, broadcast_batch, concatenate_batches, pad_batch, slice_batch
from drivetrain.data.samplers import BatchSamplerShard, IterableDatasetShard
from drivetrain.errors import CheckpointError
from drivetrain.operations import send_to_device
from drivetrain.state import GradientState, PartialState


class _Pass:
    """One iteration over a loader (one ``iter(loader)``): whether its batch in use is the last one, and how
    many samples of that last global batch are real. Two iterators over one loader each have theirs."""

    __slots__ = ("end_of_dataloader", "remainder")

    def __init__(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1


class _Progress:
    """Where the current epoch stands (a plain object: DataLoader's __setattr__ is slow per batch)."""

    __slots__ = ("batches_yielded", "loader_state", "latest_pass")

    def __init__(self) -> None:
        self.batches_yielded = 0
        self.loader_state: dict | None = None
        #: the pass whose batch was yielded last: the batch the script is using now
        self.latest_pass = _Pass()


def _placer(device: torch.device | None, non_blocking: bool) -> Callable[[Any], Any] | None:
    """A function moving a batch to ``device`` that returns it untouched, cheaply, when it is already there."""
    if device is None:
        return None
    if device.type == "cpu":

        def on_device(tensor: torch.Tensor) -> bool:
            return tensor.is_cpu
    else:

        def on_device(tensor: torch.Tensor) -> bool:
            return tensor.device == device

    def place(batch: Any) -> Any:
        kind = type(batch)
        if kind is torch.Tensor:
            return batch if on_device(batch) else batch.to(device, non_blocking=non_blocking)
        values = batch.values() if kind is dict else batch if kind is list or kind is tuple else None
        if values is not None and all(type(item) is torch.Tensor and on_device(item) for item in values):
            return batch
        return send_to_device(batch, device, non_blocking=non_blocking)

    return place


def generator_of(batch_sampler: Any) -> torch.Generator | None:
    """The ``torch.Generator`` that shuffles ``batch_sampler`` (through its ``sampler``), if any."""
    for owner in (getattr(batch_sampler, "sampler", None), batch_sampler):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            return generator
    return None


class _EpochIndices:
    """The loader's batch sampler as the DataLoader iterates it, one epoch at a time.

    It remembers the generator state the epoch's shuffle started from and can start an epoch further in
    (skipping index batches costs nothing: no sample is loaded), which is all a resume needs.
    """

    def __init__(self, batch_sampler: Any, generator: torch.Generator | None, skip: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.skip = skip  # every epoch (a skip_first_batches loader)
        self.pending_skip = 0  # the next epoch only (a resume)
        self.pending_generator_state: torch.Tensor | None = None
        self.epoch_start_state: torch.Tensor | None = None

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip, 0)

    def __iter__(self) -> Iterator[Any]:
        if self.generator is not None:
            if self.pending_generator_state is not None:
                self.generator.set_state(self.pending_generator_state)
                self.pending_generator_state = None
            self.epoch_start_state = self.generator.get_state()
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        if self.stateful_iterators:
            return _StatefulIndexBatches(self)
        return self._lazy_batches()

    def _take_skip(self) -> int:
        # The resume skip is taken when the first batch is drawn, not in iter(): torch's multi-worker
        # iterator calls iter() on the index sampler twice as it starts (in its base class and in its reset)
        # and discards the first iterator unread. (Unread, it drew nothing from the generator either, so the
        # state recorded by the second call is the one recorded by the first.)
        skip = self.skip + self.pending_skip
        self.pending_skip = 0
        return skip

    def _lazy_batches(self) -> Iterator[Any]:
        skip = self._take_skip()
        batches = iter(self.batch_sampler)
        yield from (itertools.islice(batches, skip, None) if skip else batches)

    @property
    def stateful_iterators(self) -> bool:
        """Whether the batch sampler hands out stateful iterators (torchdata's does: a StatefulDataLoader
        records and restores their state, so it must see it through this wrapper)."""
        return type(self.batch_sampler).__module__.startswith("torchdata.")


class _StatefulIndexBatches:
    """One epoch of a stateful batch sampler, started lazily as :meth:`_EpochIndices._lazy_batches` is, whose
    state is the sampler iterator's own (a position in the whole epoch: loading one replaces any skip)."""

    def __init__(self, indices: _EpochIndices) -> None:
        self.indices = indices
        self.batches: Any = None

    def _start(self, skip: bool) -> Any:
        if self.batches is None:
            count = self.indices._take_skip()
            self.batches = iter(self.indices.batch_sampler)
            for _ in range(count if skip else 0):
                next(self.batches, None)
        return self.batches

    def __iter__(self) -> _StatefulIndexBatches:
        return self

    def __next__(self) -> Any:
        return next(self._start(skip=True))

    def state_dict(self) -> dict[str, Any]:
        return self._start(skip=True).state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._start(skip=False).load_state_dict(state_dict)


class _instance_property(property):
    """A property that exists on instances only: read on the class it raises AttributeError, as an attribute
    set in ``__init__`` does (Accelerate's loaders set ``base_dataloader`` there; ``hasattr(cls, ...)`` is
    False)."""

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            name = getattr(self.fget, "__name__", "")
            raise AttributeError(f"type object {getattr(owner, '__name__', '')!r} has no attribute {name!r}")
        return super().__get__(instance, owner)


class _PreparedDataLoader(DataLoader):
    """What DataLoaderShard and DataLoaderDispatcher share (see the module docstring)."""

    #: set on the StatefulDataLoader variants built by :func:`stateful_variant`
    _stateful = False

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> Any:
        # Accelerate's constructors take use_stateful_dataloader=True and return a StatefulDataLoader.
        if use_stateful_dataloader and not cls._stateful:
            cls = stateful_variant(cls)
        return super().__new__(cls)

    def __init__(
        self,
        dataset: Any,
        device: Any = None,
        rng_types: list[str] | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        non_blocking: bool = False,
        use_stateful_dataloader: bool = False,  # decided in __new__ (the class is the stateful variant)
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self._init_kwargs = dict(
            kwargs,
            dataset=dataset,
            device=device,
            rng_types=rng_types,
            synchronized_generator=synchronized_generator,
            non_blocking=non_blocking,
        )
        self.device = torch.device(device) if device is not None else None
        self.non_blocking = non_blocking
        self.synchronized_generator = synchronized_generator
        rng_types = [str(kind) for kind in (rng_types or [])]
        if synchronized_generator is None and "generator" in rng_types:
            rng_types.remove("generator")  # nothing to synchronise: the sampler does not shuffle
        self.rng_types = rng_types
        self.skip_batches = skip_batches
        self.iteration = 0
        self._progress = _Progress()
        self._in_epoch = False
        self._resume_position: int | None = None  # batches of the next epoch already used (a resume)
        self._resume_loader_state: dict | None = None
        self._skip_owner: _PreparedDataLoader | None = None
        self._final_real: int | None = None
        self._indices: _EpochIndices | None = None
        if not isinstance(dataset, IterableDataset) and self.batch_sampler is not None:
            generator = generator_of(self.batch_sampler) or synchronized_generator
            self._indices = _EpochIndices(
                self.batch_sampler, generator, skip_batches * self._index_batches_per_step
            )

    # -- what DataLoader iterates ---------------------------------------------------------------------------
    @property
    def _index_sampler(self) -> Any:
        indices = self.__dict__.get("_indices")
        return indices if indices is not None else super()._index_sampler

    @property
    def _index_batches_per_step(self) -> int:
        """Batches of the batch sampler consumed per batch this loader yields."""
        return 1

    # -- facts the Accelerator and users read ----------------------------------------------------------------
    @property
    def use_stateful_dataloader(self) -> bool:
        """Whether this loader is built on torchdata's StatefulDataLoader."""
        return self._stateful

    @_instance_property
    def base_dataloader(self) -> DataLoader:
        """The DataLoader that does the reading: this object itself (Accelerate wraps one; here the prepared
        loader is a DataLoader, or a StatefulDataLoader with ``use_stateful_dataloader``)."""
        return self

    @property
    def gradient_state(self) -> GradientState:
        """The shared :class:`GradientState` this loader reports its end to (Accelerate's loaders hold it)."""
        return GradientState()

    @property
    def total_batch_size(self) -> int | None:
        raise NotImplementedError

    @property
    def total_dataset_length(self) -> int:
        dataset = self.dataset
        if isinstance(dataset, IterableDatasetShard):
            dataset = dataset.dataset
        return len(dataset)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s shuffle (samplers and datasets with a ``set_epoch`` method are told)."""
        self.iteration = epoch
        told = False
        for owner in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if owner is not None and hasattr(owner, "set_epoch"):
                owner.set_epoch(epoch)
                told = True
        if not told and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    # -- iteration -------------------------------------------------------------------------------------------
    def _raw_batches(self, discard: int) -> Iterator[Any]:
        """This process's batches for one epoch, without the first ``discard``."""
        raise NotImplementedError

    def _final_remainder(self) -> int:
        return -1 if self._final_real is None else self._final_real

    # Accelerate's DataLoaderStateMixin attributes, read from the pass whose batch is in use (so that
    # ``next(iter(loader))`` or two interleaved iterators report the batch the script holds).
    @property
    def end_of_dataloader(self) -> bool:
        return self._progress.latest_pass.end_of_dataloader

    @end_of_dataloader.setter
    def end_of_dataloader(self, value: bool) -> None:
        self._progress.latest_pass.end_of_dataloader = value

    @property
    def remainder(self) -> int:
        return self._progress.latest_pass.remainder

    @remainder.setter
    def remainder(self, value: int) -> None:
        self._progress.latest_pass.remainder = value

    def begin(self) -> None:
        """Register with the shared :class:`GradientState` (iterating does it; Accelerate's
        ``DataLoaderStateMixin`` method)."""
        GradientState()._add_dataloader(self)

    def end(self) -> None:
        """Unregister from the shared :class:`GradientState`: what a loop broken early calls so that the
        loader stops being the active one (iterating to the end does it)."""
        GradientState()._remove_dataloader(self)

    def __iter__(self) -> Iterator[Any]:
        if self.rng_types:
            from drivetrain.operations.random import synchronize_rng_states

            synchronize_rng_states(self.rng_types, generator=self.synchronized_generator)
        self.set_epoch(self.iteration)
        discard = self._start_epoch()
        this_pass = _Pass()
        self._final_real = None
        gradient_state = GradientState()
        gradient_state._add_dataloader(self)
        finished = False
        try:
            batches = self._raw_batches(discard)
            try:
                current = next(batches)
            except StopIteration:
                self._finish_epoch()
                finished = True
                return
            # Hoisted out of the loop: per batch, only a counter and a check that the batch is on the device.
            place = _placer(self.device, self.non_blocking)
            progress = self._progress
            if not self._takes_snapshots:
                for upcoming in batches:
                    progress.batches_yielded += 1
                    progress.latest_pass = this_pass
                    yield current if place is None else place(current)
                    current = upcoming
            else:
                # Keep torchdata's state as it was right after the batch being used was read (before the
                # look-ahead read the next one), so a saved state resumes right after it.
                snapshot = self._stateful_snapshot
                state = snapshot()
                for upcoming in batches:
                    progress.loader_state = state
                    progress.batches_yielded += 1
                    progress.latest_pass = this_pass
                    yield current if place is None else place(current)
                    current = upcoming
                    state = snapshot()
                progress.loader_state = state
            this_pass.end_of_dataloader = True
            this_pass.remainder = self._final_remainder()
            progress.batches_yielded += 1
            progress.latest_pass = this_pass
            yield current if place is None else place(current)
            self._finish_epoch()
            finished = True
        finally:
            # One registration per iteration in progress. An iterator dropped before its end
            # (``next(iter(loader))``, a loop that breaks) leaves the loader registered, as Accelerate does,
            # so gather_for_metrics still sees the batch in use; only once, however many were dropped.
            if finished or gradient_state.dataloader_references.count(self) > 1:
                gradient_state._remove_dataloader(self)

    def _start_epoch(self) -> int:
        """Apply a pending resume and the permanent skip; return the batches to read and drop."""
        position, self._resume_position = self._resume_position, None
        extra = max(position - self.skip_batches, 0) if position is not None else 0
        self._progress.batches_yielded = self.skip_batches + extra
        self._in_epoch = True
        if self._resume_loader_state is not None:
            # torchdata restores its own position (the skipped batches are already counted above).
            super().load_state_dict(self._resume_loader_state)
            self._resume_loader_state = None
            return 0
        if self._indices is not None:
            self._indices.pending_skip = extra * self._index_batches_per_step
            return 0
        return self.skip_batches + extra

    def _finish_epoch(self) -> None:
        self.iteration += 1
        self._in_epoch = False
        self._progress.batches_yielded = 0
        self._progress.loader_state = None
        if self._skip_owner is not None:
            # A skip_first_batches loader ran the rest of its owner's epoch: the owner goes on with the next.
            self._skip_owner.iteration = self.iteration

    # -- resuming --------------------------------------------------------------------------------------------
    @property
    def _stateful_snapshots(self) -> bool:
        """Whether the resume record carries torchdata's state (and a resume restores through it)."""
        return self._stateful

    @property
    def _takes_snapshots(self) -> bool:
        """Whether iterating keeps torchdata's state as of the batch in use (this process reads)."""
        return self._stateful

    def _stateful_snapshot(self) -> dict:
        return super().state_dict()

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands. A stateful loader (``use_stateful_dataloader``) returns what torchdata's
        ``StatefulDataLoader.state_dict()`` returns after the same batches, as Accelerate's loaders do; any
        other returns :meth:`resume_state`."""
        return self._torchdata_state() if self._stateful else self.resume_state()

    def _torchdata_state(self) -> dict[str, Any]:
        if self._in_epoch and self._progress.loader_state is not None:
            state = dict(self._progress.loader_state)
            # As Accelerate does: a state taken while the last batch is in use starts the next epoch.
            state["_iterator_finished"] = self.end_of_dataloader
            return state
        if self._resume_loader_state is not None:
            return dict(self._resume_loader_state)
        if not self._in_epoch and getattr(self, "_iterator", None) is not None:
            return super().state_dict()
        # Nothing read yet (or this process does not read): torchdata's "start from the beginning".
        return {}

    def resume_state(self) -> dict[str, Any]:
        """drivetrain's resume record (what ``save_state`` writes): ``epoch``, ``batches_yielded`` in it, the
        state the epoch's shuffle started from (``generator_state``), the batch geometry (checked on load) and,
        for a stateful loader, torchdata's state under ``loader``: enough for a new process to resume at the
        next sample."""
        generator = self._indices.generator if self._indices is not None else None
        generator_state = None
        if generator is not None:
            in_epoch = self._in_epoch and self._indices.epoch_start_state is not None
            generator_state = (self._indices.epoch_start_state if in_epoch else generator.get_state()).clone()
        state: dict[str, Any] = {
            "epoch": self.iteration,
            "batches_yielded": self._progress.batches_yielded if self._in_epoch else 0,
            "generator_state": generator_state,
            "total_batch_size": self.total_batch_size,
            "num_processes": getattr(self, "num_processes", 1),
        }
        if self._stateful_snapshots:
            state["loader"] = (self._progress.loader_state if self._in_epoch else None) or {}
        return state

    def _is_torchdata_state(self, state_dict: dict[str, Any]) -> bool:
        return (
            self._stateful
            and not {"epoch", "batches_yielded"} & set(state_dict)
            and (not state_dict or "_iterator_finished" in state_dict)
        )

    def check_resume_state(self, state_dict: Any) -> None:
        """Raise :class:`CheckpointError` if :meth:`load_state_dict` would refuse ``state_dict`` (its form,
        or a batch size or number of processes other than this loader's), without changing anything:
        ``load_state`` checks every loader's state before it applies any."""
        if not isinstance(state_dict, dict):
            raise CheckpointError(f"data loader state is a {type(state_dict).__name__}, not a dict")
        if self._is_torchdata_state(state_dict):
            return
        missing = {"epoch", "batches_yielded"} - set(state_dict)
        if missing:
            raise CheckpointError(
                f"data loader state is missing {', '.join(sorted(missing))}; it must come from a prepared "
                "loader's resume_state() or state_dict()"
                + (" (or a torchdata StatefulDataLoader's state_dict())" if self._stateful else "")
            )
        for key in ("epoch", "batches_yielded"):
            value = state_dict[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise CheckpointError(f"data loader state has {key}={value!r}; a whole number >= 0 is needed")
        generator_state = state_dict.get("generator_state")
        if generator_state is not None and not (
            isinstance(generator_state, torch.Tensor) and generator_state.dtype == torch.uint8
        ):
            raise CheckpointError(
                f"data loader state has a generator_state of type {type(generator_state).__name__}, not the "
                "uint8 tensor torch.Generator.get_state() gives"
            )
        for key in ("total_batch_size", "num_processes"):
            saved, here = (
                state_dict.get(key),
                (self.total_batch_size if key == "total_batch_size" else getattr(self, "num_processes", 1)),
            )
            if saved is not None and saved != here:
                raise CheckpointError(
                    f"data loader state was saved with {key}={saved} but this loader has {key}={here}; "
                    "resume with the same batch size and number of processes"
                )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`resume_state` or :meth:`state_dict` (a stateful loader also takes torchdata's
        ``StatefulDataLoader`` state): the next iteration starts at the sample after the last one used."""
        self.check_resume_state(state_dict)
        if self._is_torchdata_state(state_dict):
            self._load_torchdata_state(state_dict)
            return
        self.iteration = int(state_dict["epoch"])
        generator_state = state_dict.get("generator_state")
        if generator_state is not None and self._indices is not None and self._indices.generator is not None:
            self._indices.pending_generator_state = generator_state
        self._resume_position = int(state_dict["batches_yielded"])
        if self._stateful_snapshots and state_dict.get("loader"):
            self._resume_loader_state = state_dict["loader"]
        self._in_epoch = False

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`resume_state` (``load_state_dict`` takes it too)."""
        self.load_state_dict(state)

    def _load_torchdata_state(self, state: dict[str, Any]) -> None:
        """Resume from torchdata's state: it restores its own position when the next epoch starts."""
        self._resume_loader_state = dict(state) if state else None
        self._resume_position = 0 if not state else self._torchdata_batches(state)
        self._in_epoch = False

    def _torchdata_batches(self, state: dict[str, Any]) -> int:
        """The batches of the epoch this loader had yielded when torchdata's ``state`` was taken."""
        if state.get("_iterator_finished"):
            return 0
        read = state.get("_num_yielded")
        if read is None:  # worker processes: the last snapshot, and the batches yielded since
            snapshot = state.get("_snapshot") or {}
            read = snapshot.get("_snapshot_step", 0) + state.get("_steps_since_snapshot", 0)
        return math.ceil(int(read) / self._index_batches_per_step)

    # -- skip_first_batches ----------------------------------------------------------------------------------
    def skipping(self, num_batches: int) -> _PreparedDataLoader:
        """A loader like this one whose epochs start ``num_batches`` batches in. It replaces a resume
        position loaded into this loader (scripts written for Accelerate skip explicitly after load_state)."""
        copy = type(self)(**{**self._init_kwargs, "skip_batches": num_batches})
        copy.iteration = self.iteration
        copy._skip_owner = self
        if self._indices is not None and copy._indices is not None:
            copy._indices.pending_generator_state = self._indices.pending_generator_state
            self._indices.pending_generator_state = None
        self._resume_position = None
        self._resume_loader_state = None
        return copy


class DataLoaderShard(_PreparedDataLoader):
    """A data loader whose batches are this process's share (its batch sampler or dataset is sharded by
    :func:`~drivetrain.data_loader.prepare_data_loader`), moved to ``device``."""

    @property
    def _batch_shard(self) -> BatchSamplerShard | None:
        """The BatchSamplerShard this loader draws from: its batch sampler, or its sampler when that yields
        whole batches (``DataLoader(sampler=BatchSampler(...), batch_size=None)``)."""
        for owner in (self.batch_sampler, self.sampler):
            if isinstance(owner, BatchSamplerShard):
                return owner
        return None

    @property
    def total_batch_size(self) -> int | None:
        sampler = self._batch_shard or self.batch_sampler
        if isinstance(sampler, BatchSamplerShard):
            size = sampler.batch_size
            return size if sampler.split_batches else size * sampler.num_processes  # type: ignore[operator]
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset.global_batch_size
        return getattr(sampler, "batch_size", None) if sampler is not None else self.batch_size

    @property
    def num_processes(self) -> int:
        owner = self.batch_sampler if isinstance(self.batch_sampler, BatchSamplerShard) else self.dataset
        return (
            getattr(owner, "num_processes", 1)
            if isinstance(owner, (BatchSamplerShard, IterableDatasetShard))
            else 1
        )

    def _raw_batches(self, discard: int) -> Iterator[Any]:
        batches = super(_PreparedDataLoader, self).__iter__()
        return itertools.islice(batches, discard, None) if discard else batches

    def _final_remainder(self) -> int:
        source = self._batch_shard or self.dataset
        real = getattr(source, "final_real_samples", None)
        if real is not None:
            return real
        if (
            isinstance(self.dataset, IterableDatasetShard)
            and self.num_workers > 0
            and not self.dataset.drop_last
        ):
            # The shard ran in worker processes; its count did not come back. Use the length where known.
            try:
                rest = self.total_dataset_length % self.dataset.global_batch_size
            except TypeError:
                return -1
            return rest if rest else -1
        sharded = self._batch_shard is not None or isinstance(self.dataset, IterableDatasetShard)
        if sharded or self.drop_last or getattr(self.batch_sampler, "drop_last", False):
            return -1
        # Nothing sharded (one process): as Accelerate, the samples of the last global batch are the dataset's
        # length modulo the batch size. gather_for_metrics cuts to it what a script made batch-sized (the
        # Trainer repeats each batch's loss to the first batch's size).
        try:
            return self.total_dataset_length % self.total_batch_size  # type: ignore[operator]
        except TypeError:
            return -1


class DataLoaderDispatcher(_PreparedDataLoader):
    """A data loader that only process 0 reads: it takes the global batch (one batch with
    ``split_batches``, else ``num_processes`` batches put together), sends it to every process, and each
    keeps its slice. The last global batch is completed with samples from the first one so it divides
    evenly. Suits datasets that cannot be read in parallel (streams, iterable datasets)."""

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        num_processes: int | None = None,
        process_index: int | None = None,
        slice_fn: Any = None,
        **kwargs: Any,
    ) -> None:
        if num_processes is None or process_index is None:
            state = PartialState()
            num_processes, process_index = state.num_processes, state.process_index
        self.split_batches = split_batches
        self.num_processes = num_processes
        self.process_index = process_index
        super().__init__(dataset, **kwargs)
        self._init_kwargs.update(
            split_batches=split_batches,
            num_processes=num_processes,
            process_index=process_index,
            slice_fn=slice_fn,
        )
        self.slice_fn = slice_fn if slice_fn is not None else slice_batch
        size = self._loader_batch_size
        if split_batches and size is not None and size % num_processes != 0:
            raise ValueError(
                f"split_batches=True needs a batch size that divides by the number of processes: batch size "
                f"{size} is not a round multiple of the {num_processes} processes"
            )

    @property
    def _loader_batch_size(self) -> int | None:
        return (
            self.batch_size
            if self.batch_size is not None
            else getattr(self.batch_sampler, "batch_size", None)
        )

    @property
    def _drops_last(self) -> bool:
        return bool(self.drop_last or getattr(self.batch_sampler, "drop_last", False))

    @property
    def _index_batches_per_step(self) -> int:
        return 1 if self.split_batches else self.num_processes

    @property
    def _stateful_snapshots(self) -> bool:
        # Only process 0 holds a reading iterator; the position mechanism of the base class serves all.
        return False

    @property
    def _takes_snapshots(self) -> bool:
        # The process that reads keeps torchdata's state for state_dict(), as Accelerate's dispatcher does.
        return self._stateful and (self.process_index == 0 or PartialState().collectives.world_size <= 1)

    @property
    def total_batch_size(self) -> int | None:
        size = self._loader_batch_size
        return None if size is None else size if self.split_batches else size * self.num_processes

    def __len__(self) -> int:
        batches = super().__len__()
        if self.split_batches:
            return batches
        return batches // self.num_processes if self._drops_last else math.ceil(batches / self.num_processes)

    def _global_batches(self, discard: int) -> Iterator[Any]:
        """Process 0: the global batches of the epoch."""
        batches = super(_PreparedDataLoader, self).__iter__()
        if not self.split_batches:
            batches = self._grouped(batches)
        return itertools.islice(batches, discard, None) if discard else batches

    def _grouped(self, batches: Iterator[Any]) -> Iterator[Any]:
        group: list[Any] = []
        for batch in batches:
            group.append(batch)
            if len(group) == self.num_processes:
                yield concatenate_batches(group)
                group = []
        if group and not self._drops_last:
            yield concatenate_batches(group)

    def _raw_batches(self, discard: int) -> Iterator[Any]:
        state = PartialState()
        collectives = state.collectives
        # Without peer processes (tests, one process) every process reads, and can play any rank.
        shared = collectives.world_size > 1
        reads = self.process_index == 0 or not shared
        n, rank = self.num_processes, self.process_index
        global_batches = self._global_batches(discard) if reads else None
        head = None
        while True:
            batch, info = None, None
            if reads:
                batch = next(global_batches, None)  # type: ignore[call-overload]
                if batch is not None:
                    head = batch if head is None else head
                    real = batch_length(batch)
                    share = math.ceil(real / n)
                    padded = real if share * n != real else None
                    if padded is not None:
                        batch = pad_batch(batch, head, share * n)
                    info = (share, padded)
            if shared:
                batch, info = broadcast_batch(collectives, batch, info, state.device, is_source=reads)
            if info is None:
                return
            share, self._final_real = info
            yield self.slice_fn(
                batch, slice(rank * share, (rank + 1) * share), process_index=rank, num_processes=n
            )


_STATEFUL_CLASSES: dict[type, type] = {}


def stateful_variant(cls: type) -> type:
    """``cls`` built on torchdata's ``StatefulDataLoader`` (needs ``pip install torchdata``)."""
    if cls not in _STATEFUL_CLASSES:
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader
        except ImportError as error:
            raise ImportError(
                "use_stateful_dataloader=True needs torchdata's StatefulDataLoader: pip install 'torchdata>=0.8'"
            ) from error
        _STATEFUL_CLASSES[cls] = type(
            cls.__name__,
            (cls, StatefulDataLoader),
            {"_stateful": True, "__module__": cls.__module__, "__doc__": cls.__doc__},
        )
    return _STATEFUL_CLASSES[cls]
