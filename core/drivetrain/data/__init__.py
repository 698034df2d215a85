"""Data loading across processes: sharded samplers, prepared loaders, resuming. See docs/data-loading.md."""

from drivetrain.data.loaders import DataLoaderDispatcher, DataLoaderShard
from drivetrain.data.prepare import SkipDataLoader, prepare_data_loader, skip_first_batches
from drivetrain.data.samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
)

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "prepare_data_loader",
    "skip_first_batches",
]
