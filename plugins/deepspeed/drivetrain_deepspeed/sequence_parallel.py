"""Accelerate's ``DeepSpeedSequenceParallelConfig``: the options of DeepSpeed's Ulysses sequence parallelism
(ALST), given to ``ParallelismConfig(sp_backend="deepspeed", sp_size=..., sp_handler=...)``."""

from __future__ import annotations

import dataclasses
import os

from drivetrain.plugin_api import to_bool

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
