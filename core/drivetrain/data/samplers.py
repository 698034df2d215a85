"""Samplers that decide which samples each process reads.

Sharding happens on indices, before any sample is loaded: :class:`BatchSamplerShard` hands each process its
batches of a map-style dataset, :class:`IterableDatasetShard` its items of an iterable one. When the data does
not divide evenly and ``even_batches`` is on, both complete the last global batch with samples taken again
from the start of the data ("wrapping around"), and remember how many samples of that batch were real
(``final_real_samples``) so that ``gather_for_metrics`` can drop the copies.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler

from drivetrain.config.enums import DistributedType


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order depends only on ``data_seed`` and the epoch.

    Each epoch reseeds its generator with ``data_seed + epoch``, so every process (and every rerun) draws the
    same permutation without any communication. ``set_epoch`` selects the epoch; iterating to the end moves
    to the next one, for loops that never call ``set_epoch``.
    """

    def __init__(
        self,
        data_source: Any,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(
            data_source,
            replacement=replacement,
            num_samples=num_samples,
            generator=generator if generator is not None else torch.Generator(),
        )
        self.initial_seed = int(data_seed) if data_seed is not None else torch.initial_seed()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        # Seeds above 2**63 wrap: manual_seed accepts 64-bit values only.
        self.generator.manual_seed((self.initial_seed + self.epoch) % (2**63))
        yield from super().__iter__()
        self.epoch += 1


def _cycled(head: list, count: int, start: int = 0) -> list:
    """``count`` items of ``head`` repeated end to end, starting at ``start``."""
    return list(itertools.islice(itertools.cycle(head), start, start + count))


class BatchSamplerShard(BatchSampler):
    """This process's batches of ``batch_sampler`` (indices only; nothing is loaded here).

    - ``split_batches=False``: the batches are dealt round-robin, batch ``k`` to process ``k % num_processes``;
      a round is handed out only when every process gets a batch of full size.
    - ``split_batches=True``: every batch is cut into ``num_processes`` equal slices, one per process (the
      batch size must divide by the number of processes).

    At the end, ``drop_last`` (of the wrapped sampler) drops the incomplete round; otherwise ``even_batches``
    completes it with indices from the start of the data, so every process yields the same number of
    batches of the same size; ``even_batches=False`` hands out what is left, so counts and the last sizes
    differ between processes.
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        if not 0 <= process_index < num_processes:
            raise ValueError(
                f"process_index={process_index} is outside 0..{num_processes - 1} "
                f"(num_processes={num_processes})"
            )
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        self.sampler = getattr(batch_sampler, "sampler", None)
        #: real samples in the last global batch when it was padded, else None (set when iteration ends)
        self.final_real_samples: int | None = None
        if self.batch_size is None and split_batches:
            raise ValueError(
                f"{type(batch_sampler).__name__} has no 'batch_size' attribute, which split_batches=True needs "
                "to cut each batch into equal slices; give the batch sampler a batch_size attribute or use "
                "split_batches=False"
            )
        if split_batches and self.batch_size % num_processes != 0:
            raise ValueError(
                f"split_batches=True needs a batch size that divides by the number of processes: batch size "
                f"{self.batch_size} is not a round multiple of the {num_processes} processes; use a multiple of "
                f"{num_processes} or split_batches=False"
            )

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __len__(self) -> int:
        batches = len(self.batch_sampler)  # type: ignore[arg-type]
        n, rank = self.num_processes, self.process_index
        if self.split_batches:
            if self.even_batches or self.drop_last:
                return batches
            samples = len(self.sampler) if self.sampler is not None else None  # type: ignore[arg-type]
            if samples is None:
                return batches
            rest = samples % self.batch_size  # type: ignore[operator]
            share = self.batch_size // n  # type: ignore[operator]
            return samples // self.batch_size + (1 if rest > share * rank else 0)  # type: ignore[operator]
        if self.drop_last:
            return batches // n
        if self.even_batches:
            return math.ceil(batches / n)
        return batches // n + (1 if rank < batches % n else 0)

    def __iter__(self) -> Iterator[list[int]]:
        self.final_real_samples = None
        return self._split() if self.split_batches else self._deal()

    def _split(self) -> Iterator[list[int]]:
        size = self.batch_size
        share = size // self.num_processes  # type: ignore[operator]
        start = share * self.process_index
        stop = start + share
        head: list[int] | None = None
        for batch in self.batch_sampler:
            if head is None:
                head = list(batch)
            if len(batch) == size:
                yield batch[start:stop]
            elif self.even_batches:
                # Complete the short batch from the start of the data, so every slice is full.
                self.final_real_samples = len(batch)
                yield (list(batch) + _cycled(head, size - len(batch)))[start:stop]  # type: ignore[operator]
            elif len(batch) > start:
                yield batch[start:stop]

    def _deal(self) -> Iterator[list[int]]:
        if type(self.batch_sampler) is BatchSampler and self.batch_size:
            return self._deal_from_index_stream()
        return self._deal_batches()

    def _deal_from_index_stream(self) -> Iterator[list[int]]:
        """:meth:`_deal_batches` for torch's own BatchSampler, whose batches are consecutive chunks of its
        sampler's indices: slice this process's batches out of the index list instead of building every
        process's batches (the per-batch cost of sharding stays at that of a DistributedSampler)."""
        n, rank, size = self.num_processes, self.process_index, int(self.batch_size)  # type: ignore[arg-type]
        indices = list(self.batch_sampler.sampler)
        round_size = n * size
        full_rounds = len(indices) // round_size
        for start in range(rank * size, full_rounds * round_size, round_size):
            yield indices[start : start + size]
        tail = indices[full_rounds * round_size :]
        last_round = [tail[i : i + size] for i in range(0, len(tail), size)]
        if last_round and self.drop_last and len(last_round[-1]) < size:
            last_round.pop()
        yield from self._last_round(last_round, indices[:round_size])

    def _deal_batches(self) -> Iterator[list[int]]:
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        head: list[int] = []  # the first indices of the data, for padding the last round
        head_batches: list[list[int]] = []  # without a batch size: the first batches, padding whole batches
        round_: list[list[int]] = []
        for batch in self.batch_sampler:
            if round_ and len(round_) == n:
                # A full round held back because its last batch was short, yet more data came: not the end.
                yield round_[rank]
                round_ = []
            if size is not None and len(head) < n * size:
                head.extend(batch)
            elif size is None and len(head_batches) < n:
                head_batches.append(batch)
            round_.append(batch)
            if len(round_) == n and (size is None or len(batch) == size):
                yield round_[rank]
                round_ = []
        yield from self._last_round(round_, head, head_batches)

    def _last_round(
        self, round_: list[list[int]], head: list[int], head_batches: list[list[int]] | None = None
    ) -> Iterator[list[int]]:
        """This process's batch of the last, incomplete round (padded from ``head`` with even_batches)."""
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        if not round_ or self.drop_last:
            return
        if not self.even_batches:
            if rank < len(round_):
                yield round_[rank]
            return
        if size is None:
            # Batches of varying size (no batch_size): the round is completed with whole batches from the
            # start of the data, so every process yields the same number of batches.
            self.final_real_samples = sum(len(batch) for batch in round_)
            yield [*round_, *_cycled(head_batches or round_, n - len(round_))][rank]
            return
        # Pad the last round to ``n`` full batches with indices from the start of the data.
        self.final_real_samples = sum(len(batch) for batch in round_)
        padding = _cycled(head, n * size - self.final_real_samples)  # type: ignore[operator]
        flat = [index for batch in round_ for index in batch] + padding
        yield flat[rank * size : (rank + 1) * size]  # type: ignore[operator]


class IterableDatasetShard(IterableDataset):
    """This process's items of an iterable ``dataset``.

    Items are read in global batches (``batch_size * num_processes`` items, or ``batch_size`` with
    ``split_batches``); each process keeps its contiguous slice. A short last global batch is dropped with
    ``drop_last``, else completed with the first items of the data (so every process gets the same count).
    Every process reads the whole dataset: the data must come in the same order on every process.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index={process_index} is outside 0..{num_processes - 1}")
        if split_batches and batch_size > 1 and batch_size % num_processes != 0:
            raise ValueError(
                f"split_batches=True needs a batch size that divides by the number of processes: batch size "
                f"{batch_size} is not a round multiple of the {num_processes} processes"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0
        self.final_real_samples: int | None = None

    @property
    def global_batch_size(self) -> int:
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        return self.global_batch_size // self.num_processes if self.split_batches else self.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        rounds = len(self.dataset) / self.global_batch_size
        return (math.floor(rounds) if self.drop_last else math.ceil(rounds)) * self.process_batch_size

    def __iter__(self) -> Iterator[Any]:
        self.final_real_samples = None
        size, share = self.global_batch_size, self.process_batch_size
        start = share * self.process_index
        stop = start + share
        head: list[Any] | None = None
        buffer: list[Any] = []
        for item in self.dataset:
            buffer.append(item)
            if len(buffer) == size:
                if head is None:
                    head = buffer
                yield from buffer[start:stop]
                buffer = []
        if buffer and not self.drop_last:
            self.final_real_samples = len(buffer)
            buffer += _cycled(head if head is not None else buffer, size - len(buffer))
            yield from buffer[start:stop]


class SkipBatchSampler(BatchSampler):
    """``batch_sampler`` without its first ``skip_batches`` batches (they are never loaded)."""

    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        self.sampler = getattr(batch_sampler, "sampler", None)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)


@contextlib.contextmanager
def join_uneven_inputs(
    joinables: list[Any],
    loaders: Iterable[Any],
    even_batches: bool | None,
    use_distributed: bool,
    distributed_type: DistributedType,
    backend_plugin: str,
) -> Iterator[None]:
    """``Accelerator.join_uneven_inputs``: torch's ``Join`` over ``joinables`` for the block, with the prepared
    ``loaders``' ``even_batches`` set as asked; a warning and no join in one process or when the backend in
    charge of ``distributed_type`` (``backend_plugin`` for plain processes) does not declare
    ``Capabilities.joinable``. The warnings name the script's ``with`` line: the Accelerator returns this
    context manager itself, so the caller is two frames up."""
    if not use_distributed:
        warnings.warn("join_uneven_inputs does nothing in a single process", stacklevel=3)
        yield
        return
    from torch.distributed.algorithms.join import Join

    if not _joinable(distributed_type, backend_plugin):
        warnings.warn(
            f"join_uneven_inputs is only supported for multi-GPU or multi-CPU data parallelism, not "
            f"{distributed_type}; the block runs without it",
            UserWarning,
            stacklevel=3,
        )
        yield
        return
    with even_batches_set_to(loaders, even_batches), Join(joinables):
        yield


def _joinable(distributed_type: DistributedType, backend_plugin: str) -> bool:
    """Whether the backend in charge of ``distributed_type`` in a run of ``backend_plugin`` joins (the
    registry's rule: ``Capabilities.joinable``; a type whose backend is not installed: no)."""
    from drivetrain.contract.registry import get_plugin_registry

    return get_plugin_registry().joins(str(distributed_type.value), backend_plugin)


@contextlib.contextmanager
def even_batches_set_to(loaders: Iterable[Any], even_batches: bool | None) -> Iterator[None]:
    """In the block, the prepared ``loaders`` complete their last batch (``even_batches=True``) or not
    (``join_uneven_inputs(even_batches=...)``), as their sharded batch samplers allow; restored on exit.
    ``None`` changes nothing. Loaders without such a sampler (iterable or dispatched ones) keep padding, with a
    warning."""
    previous: dict[int, tuple[Any, bool]] = {}
    if even_batches is not None:
        unchanged = False
        for loader in loaders:
            sampler: Any = getattr(loader, "batch_sampler", None)
            if hasattr(sampler, "even_batches"):
                previous[id(sampler)] = (sampler, sampler.even_batches)
                sampler.even_batches = even_batches
            else:
                unchanged = True
        if unchanged:
            warnings.warn(
                "join_uneven_inputs(even_batches=...) is only supported for map-style datasets: the "
                "iterable (or dispatched) data loaders prepared here keep padding their last batch",
                UserWarning,
                stacklevel=5,  # the script's `with accelerator.join_uneven_inputs(...)`
            )
    try:
        yield
    finally:
        for sampler, value in previous.values():
            sampler.even_batches = value
