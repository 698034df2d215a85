"""The megatron-core MLP block that the megatron test scripts and tests/gpu/check_megatron_optimizer.py train:
a ColumnParallelLinear (hidden -> ffn, its output left split over the tensor-parallel ranks), GELU, then a
RowParallelLinear (ffn -> hidden, taking the split input and summing over the ranks); both with bias and
xavier-normal weights. A module that holds the pair as ``up`` and ``down`` has the dense model's parameter
names, which the tests compare by name; the functions below take such a module."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel


def column_row_pair(
    config, hidden: int, ffn: int
) -> tuple[tensor_parallel.ColumnParallelLinear, tensor_parallel.RowParallelLinear]:
    """``up`` then ``down``, initialised in that order (each draws its weights from the seeded generator)."""
    init = torch.nn.init.xavier_normal_
    up = tensor_parallel.ColumnParallelLinear(
        hidden, ffn, config=config, init_method=init, bias=True, gather_output=False
    )
    down = tensor_parallel.RowParallelLinear(
        ffn,
        hidden,
        config=config,
        init_method=init,
        bias=True,
        input_is_parallel=True,
        skip_bias_add=False,
    )
    return up, down


def column_row_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down(gelu(up(x))) through ``module``'s pair; megatron-core's layers return (output, bias), the bias
    already added here."""
    hidden, _ = module.up(x)
    out, _ = module.down(torch.nn.functional.gelu(hidden))
    return out


def full_column_row_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The dense weights of ``module``'s pair, gathered over the tensor-parallel group: the column-parallel layer is split by output
    rows, the row-parallel one by input columns (its bias is whole on every rank)."""
    group = ps.get_tensor_model_parallel_group()
    size = ps.get_tensor_model_parallel_world_size()

    def gathered(tensor: torch.Tensor, dim: int) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(parts, tensor.detach().contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    return {
        "up.weight": gathered(module.up.weight, 0),
        "up.bias": gathered(module.up.bias, 0),
        "down.weight": gathered(module.down.weight, 1),
        "down.bias": module.down.bias.detach().clone(),
    }
