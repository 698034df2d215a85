"""Megatron-LM's indexed datasets for ``MegatronLMDummyDataLoader(data_path=...)``: megatron-core's
``GPTDataset`` splits, built by ``BlendedMegatronDatasetBuilder`` from ``.bin``/``.idx`` files (written by
megatron-core's ``IndexedDatasetBuilder`` or Megatron-LM's ``preprocess_data.py``).

Dataset arguments (Megatron-LM's names): ``data_path`` (prefixes, or alternating weights and prefixes),
``splits_string`` / ``split`` (``"949,50,1"``), ``seq_length``, ``micro_batch_size``, ``seed`` (1234),
``eod_token`` and ``vocab_size`` (or ``tokenizer``: an object with ``eod``, ``vocab_size`` and
``unique_identifiers``, as megatron-core's tokenizers have), ``data_cache_path`` (where the sample indices
are cached; default: next to the data), ``reset_position_ids``, ``reset_attention_mask``, ``eod_mask_loss``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from drivetrain.plugin_api import ConfigurationError
from drivetrain_megatron.config import MegatronLMPlugin


class TokenIds:
    """The special-token facts megatron-core's GPT dataset needs from a tokenizer: the end-of-document id
    (documents are joined with it; with ``eod_mask_loss`` its positions leave the loss) and the vocabulary
    size."""

    def __init__(self, eod: int, vocab_size: int | None) -> None:
        self.eod = eod
        self.vocab_size = vocab_size

    @property
    def unique_identifiers(self) -> OrderedDict:
        # part of the sample-index cache key: another eod or vocabulary must not reuse a cached index
        return OrderedDict(eod=self.eod, vocab_size=self.vocab_size)


def _tokenizer(args: dict[str, Any]) -> Any:
    if args.get("tokenizer") is not None:
        return args["tokenizer"]
    if args.get("eod_token") is None:
        raise ConfigurationError(
            "MegatronLMDummyDataLoader(data_path=...) needs the end-of-document token: pass eod_token=<id> "
            "(and vocab_size=...) or tokenizer=<a megatron-core tokenizer>"
        )
    vocab_size = args.get("vocab_size")
    return TokenIds(int(args["eod_token"]), int(vocab_size) if vocab_size is not None else None)


def _blend(data_path: Any) -> Any:
    from megatron.core.datasets.utils import get_blend_from_list

    paths = [data_path] if isinstance(data_path, str) else [str(item) for item in data_path]
    if len(paths) == 1:
        paths = paths[0].split()
    return get_blend_from_list(paths)


def _check_files(prefixes: list[str]) -> None:
    import os

    from megatron.core.datasets.indexed_dataset import get_bin_path, get_idx_path

    for prefix in prefixes:
        missing = [path for path in (get_bin_path(prefix), get_idx_path(prefix)) if not os.path.isfile(path)]
        if missing:
            raise ConfigurationError(
                f"MegatronLMDummyDataLoader: data_path {prefix!r} names no indexed dataset ({', '.join(missing)} "
                "not found); pass the prefix of a .bin/.idx pair, without the extension"
            )


def split_sizes(config: MegatronLMPlugin, global_batch_size: int) -> list[int | None]:
    """Samples to draw per split, as Megatron-LM counts them from ``train_iters``; without it, one pass over
    each split (None)."""
    if config.train_iters is None:
        return [None, None, None]
    evaluations = config.train_iters // config.eval_interval + 1
    return [
        config.train_iters * global_batch_size,
        evaluations * config.eval_iters * global_batch_size,
        config.eval_iters * global_batch_size,
    ]


def build_gpt_datasets(args: dict[str, Any], config: MegatronLMPlugin, global_batch_size: int) -> tuple:
    """(train, valid, test) megatron-core ``GPTDataset`` splits (a split of weight 0 is None). Every process
    builds them; megatron-core's builder lets global rank 0 write the cached sample indices first."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    seq_length = args.get("seq_length", config.seq_length)
    if seq_length is None:
        raise ConfigurationError(
            "MegatronLMDummyDataLoader(data_path=...) needs seq_length=... (tokens per sample)"
        )
    blend = _blend(args["data_path"])
    _check_files(blend[0])
    split = args.get("splits_string", args.get("split", "969,30,1"))
    dataset_config = GPTDatasetConfig(
        random_seed=int(args.get("seed", 1234)),
        sequence_length=int(seq_length),
        blend=blend,
        split=str(split),
        path_to_cache=args.get("data_cache_path"),
        tokenizer=_tokenizer(args),
        reset_position_ids=bool(args.get("reset_position_ids", False)),
        reset_attention_mask=bool(args.get("reset_attention_mask", False)),
        eod_mask_loss=bool(args.get("eod_mask_loss", False)),
    )
    sizes = split_sizes(config, global_batch_size)
    if blend[1] is not None and sizes[0] is None:
        raise ConfigurationError(
            "MegatronLMDummyDataLoader: a weighted data_path blend needs MegatronLMPlugin.train_iters (the "
            "number of samples to draw from the blend)"
        )
    builder = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, dataset_config)
    return tuple(builder.build())
