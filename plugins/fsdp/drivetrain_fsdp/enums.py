"""The FSDP1 names a user picks from (Accelerate's, by name or 1-based number)."""

from __future__ import annotations

import enum


class _NamedEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str(self.value)


class ShardingStrategy(_NamedEnum):
    """FSDP1's strategy names; see docs/fsdp.md for what each becomes under FSDP2."""

    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"
    HYBRID_SHARD_ZERO2 = "HYBRID_SHARD_ZERO2"


class StateDictType(_NamedEnum):
    # Accelerate's (and torch's) numbering: 1 FULL, 2 LOCAL, 3 SHARDED.
    FULL_STATE_DICT = "FULL_STATE_DICT"
    LOCAL_STATE_DICT = "LOCAL_STATE_DICT"
    SHARDED_STATE_DICT = "SHARDED_STATE_DICT"


class AutoWrapPolicy(_NamedEnum):
    TRANSFORMER_BASED_WRAP = "TRANSFORMER_BASED_WRAP"
    SIZE_BASED_WRAP = "SIZE_BASED_WRAP"
    NO_WRAP = "NO_WRAP"


class BackwardPrefetch(_NamedEnum):
    BACKWARD_PRE = "BACKWARD_PRE"
    BACKWARD_POST = "BACKWARD_POST"
    NO_PREFETCH = "NO_PREFETCH"
