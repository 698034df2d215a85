"""Context parallelism through torch's ``context_parallel``: inside ``accelerator.maybe_context_parallel`` the
given buffers are sharded along their sequence dimension over the mesh's ``cp`` dimension, and
``scaled_dot_product_attention`` runs as ring attention across those ranks. FSDP2 shards parameters over
``dp_shard_cp`` (data-parallel shards and cp ranks together), so gradients are averaged over the cp ranks too,
which makes the step equal to one over whole sequences.

torch implements the ring only for the CUDA attention kernels (flash, memory-efficient, cuDNN); on CPU its
``_scaled_dot_product_flash_attention_for_cpu`` has no sharding rule, which this module turns into an error
that says so. Models without attention (or whose token mixing is not SDPA) shard on CPU too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError

#: What torch reports when attention runs inside context_parallel on CPU.
_CPU_ATTENTION = "_scaled_dot_product_flash_attention_for_cpu"


def context_parallel_factory(mesh: Any, handler: Any) -> Any:
    """The ``DistributedEnvironment.context_parallel`` of a run with a ``cp`` dimension."""
    strategy = getattr(handler, "cp_comm_strategy", None) or "allgather"

    @contextlib.contextmanager
    def context_parallel(
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        from torch.distributed.tensor.experimental import context_parallel as torch_context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method(strategy)
        with torch_context_parallel(
            mesh["cp"],
            buffers=buffers,
            buffer_seq_dims=buffer_seq_dims,
            no_restore_buffers=no_restore_buffers,
        ):
            try:
                yield
            except NotImplementedError as exc:
                if _CPU_ATTENTION in str(exc):
                    raise ConfigurationError(
                        "context parallelism (cp_size > 1) runs attention as ring attention, which torch implements "
                        "for its CUDA attention kernels only: scaled_dot_product_attention on CPU cannot be sharded "
                        "over the sequence. Run context parallelism on GPUs"
                    ) from exc
                raise

    return context_parallel


def attach_attention_mask_hooks(model: torch.nn.Module) -> None:
    """transformers attention modules (``*.self_attn``) get their ``attention_mask`` dropped and
    ``is_causal=True`` set: ring attention has no mask, and a causal mask is what it computes. Models whose
    layers need another mask (sliding-window or chunked attention) are refused, since dropping it would
    train them as fully causal."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        other = sorted({kind for kind in layer_types if kind != "full_attention"})
    else:
        other = ["sliding_attention"] if getattr(config, "sliding_window", None) else []
    if other:
        raise ConfigurationError(
            f"context parallelism computes full causal attention only, but {type(model).__name__} has layers of "
            f"type {', '.join(other)}; use a full-attention model or set cp_size=1"
        )

    def drop_mask(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = None
            kwargs["is_causal"] = True
        return args, kwargs

    for name, module in model.named_modules():
        if name.endswith("self_attn"):
            module.register_forward_pre_hook(drop_mask, with_kwargs=True, prepend=True)
