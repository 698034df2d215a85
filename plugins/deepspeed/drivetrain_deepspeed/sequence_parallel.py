"""Accelerate's ``DeepSpeedSequenceParallelConfig``: the options of DeepSpeed's Ulysses sequence parallelism
(ALST), given to ``ParallelismConfig(sp_backend="deepspeed", sp_size=..., sp_handler=...)``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from drivetrain.plugin_api.settings import to_bool

#: attention implementations Ulysses wraps; a Hub kernel (``owner/name``) is accepted as well
BUILTIN_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")


@dataclasses.dataclass
class DeepSpeedSequenceParallelConfig:
    """``sp_seq_length_is_variable`` (default True, or ``PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE``): the
    sequence length may change between batches; when False, ``sp_seq_length`` (or
    ``PARALLELISM_CONFIG_SP_SEQ_LENGTH``) is the one length every batch has. ``sp_attn_implementation`` (or
    ``PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION``): one of :data:`BUILTIN_ATTENTION` or a Hub kernel
    ``owner/name``."""

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            variable = os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "").strip() or "true"
            self.sp_seq_length_is_variable = to_bool(variable, "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE")
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            length = os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            if length is None:
                raise ValueError(
                    "DeepSpeedSequenceParallelConfig: sp_seq_length_is_variable=False needs sp_seq_length "
                    "(or PARALLELISM_CONFIG_SP_SEQ_LENGTH), the length every batch has"
                )
            self.sp_seq_length = None if length == "None" else int(length)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = os.environ.get("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION")
        attention = self.sp_attn_implementation
        if attention is not None and attention not in BUILTIN_ATTENTION and attention.count("/") != 1:
            raise ValueError(
                f"Invalid sp_attn_implementation {attention!r}: use one of {', '.join(BUILTIN_ATTENTION)} "
                "or a Hub kernel 'owner/name'"
            )


def state_ulysses_dl_adapter(state: Any) -> Callable[[Any, Any], Any]:
    """``accelerator.deepspeed_ulysses_dl_adapter(dl, model)`` (Accelerate's; the Trainer calls it for a data
    loader prepared apart from the model): with sequence parallelism (``parallelism_config.sp_size`` > 1) the
    loader becomes DeepSpeed's ``UlyssesSPDataLoaderAdapter`` over the sequence-parallel group DeepSpeed set up,
    which splits each batch along the sequence among the group's ranks; otherwise the loader itself."""

    def adapter(dl: Any, model: Any) -> Any:
        config = getattr(state, "parallelism_config", None)
        if (getattr(config, "sp_size", None) or 1) == 1:
            return dl
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
        from deepspeed.utils import groups

        return UlyssesSPDataLoaderAdapter(
            dl,
            sp_rank=groups._get_sequence_parallel_rank(),
            sp_group=groups._get_sequence_parallel_group(),
            sp_world_size=groups._get_sequence_parallel_world_size(),
            device=model.device,
        )

    return adapter
