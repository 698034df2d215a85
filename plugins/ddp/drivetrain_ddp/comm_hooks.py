"""bf16 gradient compression that also runs on gloo.

torch ships ``bf16_compress_hook``/``bf16_compress_wrapper`` but refuses to register them (by their names)
unless NCCL 2.10+ or XCCL is present. gloo all-reduces bfloat16 tensors fine, so on other backends the
ddp plugin registers these equivalents: cast the bucket to bfloat16, all-reduce the average, cast back.
"""

# No ``from __future__ import annotations``: DDP checks a hook's annotations as real objects.
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def _averaged_in_bf16(process_group: Any, tensor: torch.Tensor) -> torch.futures.Future:
    """Start an all-reduce of ``tensor / world_size`` in bfloat16; the future holds the bf16 result."""
    group = process_group if process_group is not None else dist.group.WORLD
    compressed = tensor.to(torch.bfloat16).div_(dist.get_world_size(group))
    return dist.all_reduce(compressed, group=group, async_op=True).get_future()


def bf16_compress_any_backend(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket's gradients across ranks, sent as bfloat16."""
    buffer = bucket.buffer()

    def write_back(future: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(future.value()[0])
        return buffer

    return _averaged_in_bf16(process_group, buffer).then(write_back)


def bf16_compress_wrapper_any_backend(hook: Callable) -> Callable:
    """Wrap a communication hook (e.g. PowerSGD) so that what it sends is cast to bfloat16 first."""

    def bf16_wrapped_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        original_dtype = buffer.dtype
        bucket.set_buffer(buffer.to(torch.bfloat16))
        inner = hook(state, bucket)

        def restore(future: torch.futures.Future) -> torch.Tensor:
            result = future.value()
            buffer.copy_(result.to(original_dtype) if isinstance(result, torch.Tensor) else result[0])
            return buffer

        return inner.then(restore)

    return bf16_wrapped_hook


def bf16_hooks_supported_by_torch() -> bool:
    """Whether torch accepts its own bf16 hooks here (NCCL 2.10+ on CUDA, or XCCL on XPU)."""
    try:
        nccl = (
            torch.version.cuda is not None
            and dist.is_nccl_available()
            and torch.cuda.nccl.version() >= (2, 10)
        )
    except Exception:  # an unusual CUDA build without NCCL introspection: use ours
        nccl = False
    xccl = getattr(dist, "is_xccl_available", lambda: False)() and torch.xpu.is_available()
    return bool(nccl or xccl)


def repair_batched_power_sgd() -> None:
    """Make torch's ``batched_powerSGD_hook`` work where it is broken (torch 2.13 at least).

    That hook orthogonalises a single (2-D) matrix, but ``_orthogonalize`` now insists on a 3-D batch and
    raises ``AssertionError`` at the first compressed step (``start_powerSGD_iter``). When the probe below
    shows that, the module's ``_orthogonalize`` is replaced by one that views a 2-D matrix as a batch of
    one; the work is still done in place on the same storage. A torch that accepts 2-D is left untouched.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    original = powerSGD_hook._orthogonalize
    if getattr(original, "_drivetrain_repaired", False):
        return
    try:
        original(torch.ones(2, 1))
        return
    except AssertionError:
        pass

    def orthogonalize(matrices: torch.Tensor, epsilon: float = 0) -> Any:
        if matrices.dim() == 2:
            return original(matrices.unsqueeze(0), epsilon=epsilon)
        return original(matrices, epsilon=epsilon)

    orthogonalize._drivetrain_repaired = True  # type: ignore[attr-defined]
    powerSGD_hook._orthogonalize = orthogonalize
