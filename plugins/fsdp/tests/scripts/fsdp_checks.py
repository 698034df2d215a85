"""Checks of the fsdp backend in 2 real processes (gloo), many per launch; see test_fsdp_multiprocess.py.

Usage: fsdp_checks.py WORKDIR. Leaves in WORKDIR a SHARDED checkpoint saved after step 1
(``sharded``), the weights an uninterrupted run has after step 3 (``expected_after_3.pt``) and the weights
at the save (``weights_at_save.pt``), for the resharding runs and the merge-weights test.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.distributed as dist
from fsdp_common import (
    HIDDEN,
    check,
    full_parameters,
    loss_of,
    make_model,
    max_difference,
    train_steps,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from drivetrain import Accelerator, FullyShardedDataParallelPlugin, merge_fsdp_weights
from drivetrain.config.enums import DistributedType
from drivetrain.errors import ConfigurationError
from drivetrain.state import GradientState

TOLERANCE = 2e-5


def ddp_reference(steps, max_norm=0.5):
    """The same training under torch's DistributedDataParallel; returns its weights and the clip norms."""
    world, rank = dist.get_world_size(), dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    norms = []
    for step in steps:
        loss_of(model, step, rank, world).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item())
        optimizer.step()
        optimizer.zero_grad()
    return full_parameters(model.module), norms


def check_strategies(reference, reference_norms):
    world = dist.get_world_size()
    cases = [
        ("full_shard", {"sharding_strategy": "FULL_SHARD"}, True),
        ("shard_grad_op", {"sharding_strategy": "SHARD_GRAD_OP"}, True),
        ("reshard_after_forward_false", {"reshard_after_forward": False}, True),
        ("no_shard", {"sharding_strategy": "NO_SHARD"}, False),
        ("hybrid_shard", {"sharding_strategy": "HYBRID_SHARD"}, True),  # mesh (1, 2)
        (
            "hybrid_shard_replicate",
            {"sharding_strategy": "HYBRID_SHARD", "hybrid_shard_size": 1},
            False,
        ),  # (2, 1)
        ("hybrid_shard_zero2", {"sharding_strategy": "HYBRID_SHARD_ZERO2"}, True),
    ]
    for name, fields, sharded in cases:
        plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"], **fields)
        accelerator = Accelerator(fsdp_plugin=plugin)
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)  # built before prepare: re-bound
        model, optimizer = accelerator.prepare(model, optimizer)
        norms = []
        for step in range(4):
            accelerator.backward(loss_of(model, step, accelerator.process_index, world))
            norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
            optimizer.step()
            optimizer.zero_grad()
        difference = max_difference(full_parameters(model), reference)
        check(f"{name}_equals_ddp", difference < TOLERANCE, f"max diff {difference}")
        check(
            f"{name}_clip_norm_global",
            max(abs(a - b) for a, b in zip(norms, reference_norms)) < 1e-4,
            f"{norms} vs ddp {reference_norms}",
        )
        params = dict(model.named_parameters())
        weight = params["embed.weight"]
        local = weight.to_local().numel()
        gathered = [0] * world
        dist.all_gather_object(gathered, local)
        if sharded:
            check(
                f"{name}_holds_only_its_shard",
                local < weight.numel() and sum(gathered) == weight.numel(),
                f"local {gathered} of {weight.numel()}",
            )
        else:
            check(f"{name}_replicated", gathered == [weight.numel()] * world, str(gathered))
        check(
            f"{name}_optimizer_rebound",
            all(isinstance(p, DTensor) for group in optimizer.param_groups for p in group["params"])
            and {id(p) for group in optimizer.param_groups for p in group["params"]}
            == {id(p) for p in params.values()},
        )
    check(
        "units_bottom_up",
        all(isinstance(block, FSDPModule) for block in model.blocks)
        and isinstance(model, FSDPModule)
        and not isinstance(model.head, FSDPModule),
    )
    check(
        "distributed_type_fsdp",
        accelerator.distributed_type == DistributedType.FSDP,
        accelerator.distributed_type.value,
    )


def check_accumulation(world, rank):
    """accumulate() over two halves == one step on the whole batch; no reduce-scatter until the boundary."""
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(), gradient_accumulation_steps=2)
    reference = torch.nn.parallel.DistributedDataParallel(make_model())
    model = accelerator.prepare(make_model())
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    from fsdp_common import batch

    for step in range(2):
        inputs, targets = batch(step, rank, world)
        half = len(inputs) // 2
        for part in range(2):
            rows = slice(part * half, (part + 1) * half)
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows]))
                if part == 0:
                    # FSDP2 keeps the unsharded gradient to itself until the boundary's reduce-scatter.
                    check("no_sync_defers_reduce_scatter", model.embed.weight.grad is None)
                optimizer.step()
                optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(inputs), targets).backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    difference = max_difference(full_parameters(model), full_parameters(reference.module))
    check("accumulate_equals_full_batch", difference < TOLERANCE, f"max diff {difference}")
    GradientState(gradient_accumulation_plugin=None).plugin_kwargs = {}


def gradients_with(activation_checkpointing, world, rank):
    plugin = FullyShardedDataParallelPlugin(
        transformer_cls_names_to_wrap=["Block"], activation_checkpointing=activation_checkpointing
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(make_model())
    recomputed = []
    model.blocks[0].linear.register_forward_hook(lambda *args: recomputed.append(torch.is_grad_enabled()))
    accelerator.backward(loss_of(model, 0, rank, world))
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    return grads, len(recomputed), sorted(model.state_dict())


def check_activation_checkpointing(world, rank):
    plain, plain_forwards, plain_keys = gradients_with(False, world, rank)
    checkpointed, forwards, keys = gradients_with(True, world, rank)
    check(
        "activation_checkpointing_recomputes",
        plain_forwards == 1 and forwards == 2,
        f"{plain_forwards}, {forwards}",
    )
    check("activation_checkpointing_same_gradients", max_difference(plain, checkpointed) < 1e-6)
    check("activation_checkpointing_same_names", plain_keys == keys, f"{keys}")


def check_mixed_precision(world, rank):
    policy = {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    # Each unit casts its inputs to param_dtype; buffers (``scale``) stay fp32, so the blocks are units.
    plugin = FullyShardedDataParallelPlugin(
        mixed_precision_policy=policy, transformer_cls_names_to_wrap=["Block"]
    )
    accelerator = Accelerator(fsdp_plugin=plugin, mixed_precision="bf16")
    model = accelerator.prepare(make_model())
    seen = {}
    model.blocks[0].linear.register_forward_hook(
        lambda module, inputs, output: seen.update(weight=module.weight.dtype, output=output.dtype)
    )
    accelerator.backward(loss_of(model, 0, rank, world).float())
    check(
        "mixed_precision_compute_in_bf16",
        seen == {"weight": torch.bfloat16, "output": torch.bfloat16},
        str(seen),
    )
    check("mixed_precision_sharded_params_fp32", all(p.dtype == torch.float32 for p in model.parameters()))
    check("mixed_precision_grads_fp32", all(p.grad.dtype == torch.float32 for p in model.parameters()))
    check(
        "mixed_precision_policy_replaces_autocast", isinstance(accelerator.autocast(), contextlib.nullcontext)
    )


def check_loading(world, rank):
    reference = full_parameters(make_model(seed=0))
    # cpu_ram_efficient_loading: rank 0 loads, the others start from meta tensors.
    if rank == 0:
        model = make_model(seed=0)
    else:
        with torch.device("meta"):
            model = make_model(seed=0)
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True))
    model = accelerator.prepare(model)
    check("ram_efficient_loading_rank0_weights", max_difference(full_parameters(model), reference) == 0.0)
    check(
        "ram_efficient_loading_buffers",
        torch.equal(model.scale, torch.full((HIDDEN,), 1.0)),
        str(model.scale),
    )
    check("ram_efficient_loading_no_meta", not any(p.is_meta for p in model.parameters()))
    # sync_module_states: ranks that built different weights end with rank 0's.
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(sync_module_states=True))
    model = accelerator.prepare(make_model(seed=rank))
    check("sync_module_states_rank0_weights", max_difference(full_parameters(model), reference) == 0.0)


def check_optimizer_with_state_refused():
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model(torch.zeros(2, 6)).sum().backward()
    optimizer.step()
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    try:
        accelerator.prepare(model, optimizer)
    except ConfigurationError as exc:
        check("optimizer_with_state_refused", "already holds state" in str(exc), str(exc))
    else:
        check("optimizer_with_state_refused", False, "no error")


def check_checkpoints(workdir):
    world, rank = dist.get_world_size(), dist.get_rank()
    for kind in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        tag = kind.split("_")[0].lower()
        plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"], state_dict_type=kind)
        accelerator = Accelerator(fsdp_plugin=plugin)
        model = make_model()
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.05))
        scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9))
        train_steps(accelerator, model, optimizer, range(2))
        scheduler.step()
        folder = os.path.join(workdir, tag)
        accelerator.save_state(folder)
        weights_at_save = model.full_state_dict()
        train_steps(accelerator, model, optimizer, range(2, 4))
        uninterrupted = full_parameters(model)

        accelerator = Accelerator(fsdp_plugin=plugin)
        fresh = make_model(seed=5)
        fresh.scale.fill_(1.0)  # a non-persistent buffer: not part of any checkpoint
        fresh, fresh_optimizer = accelerator.prepare(fresh, torch.optim.AdamW(fresh.parameters(), lr=0.05))
        fresh_scheduler = accelerator.prepare(
            torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=1, gamma=0.9)
        )
        accelerator.load_state(folder)
        check(f"{tag}_scheduler_restored", fresh_scheduler.get_last_lr() == scheduler.get_last_lr())
        train_steps(accelerator, fresh, fresh_optimizer, range(2, 4))
        difference = max_difference(full_parameters(fresh), uninterrupted)
        check(f"{tag}_save_load_continue_equals_uninterrupted", difference < 1e-6, f"max diff {difference}")
        if kind == "SHARDED_STATE_DICT":
            check(
                "sharded_each_rank_writes_its_shard",
                sorted(os.listdir(os.path.join(folder, "pytorch_model_fsdp_0")))
                == [".metadata"] + [f"__{r}_0.distcp" for r in range(world)]
                and os.path.isdir(os.path.join(folder, "optimizer_0")),
                str(os.listdir(folder)),
            )
            if rank == 0:
                torch.save(uninterrupted, os.path.join(workdir, "expected_after_3.pt"))
                torch.save(weights_at_save, os.path.join(workdir, "weights_at_save.pt"))
            merged = os.path.join(workdir, "merged")
            # every rank calls it, as with Accelerate: the main one writes, all return once it is written
            merge_fsdp_weights(folder, merged)
            if rank == 0:
                from safetensors.torch import load_file

                merged_state = load_file(os.path.join(merged, "model.safetensors"))
                check(
                    "merge_weights_equals_trained_model",
                    merged_state.keys() == weights_at_save.keys()
                    and all(torch.equal(merged_state[k], weights_at_save[k]) for k in merged_state),
                )
        else:
            check(
                "full_checkpoint_files",
                os.path.isfile(os.path.join(folder, "model.safetensors"))
                and os.path.isfile(os.path.join(folder, "optimizer.bin"))
                and not os.path.exists(os.path.join(folder, "pytorch_model_fsdp_0")),
                str(os.listdir(folder)),
            )
            check("full_state_dict_only_on_rank0", (len(weights_at_save) > 0) == (rank == 0))
            check(
                "full_state_dict_on_cpu",
                all(t.device.type == "cpu" and not isinstance(t, DTensor) for t in weights_at_save.values()),
            )


def main() -> None:
    torch.set_num_threads(1)
    workdir = sys.argv[1]
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    world, rank = accelerator.num_processes, accelerator.process_index
    assert world == 2 and accelerator.state.backend_name == "fsdp", accelerator.state
    sections = sys.argv[2:] or [
        "strategies",
        "accumulation",
        "activation_checkpointing",
        "mixed_precision",
        "loading",
        "optimizer_state",
        "checkpoints",
    ]
    reference, reference_norms = ddp_reference(range(4))
    for section in sections:
        if section == "strategies":
            check_strategies(reference, reference_norms)
        elif section == "accumulation":
            check_accumulation(world, rank)
        elif section == "activation_checkpointing":
            check_activation_checkpointing(world, rank)
        elif section == "mixed_precision":
            check_mixed_precision(world, rank)
        elif section == "loading":
            check_loading(world, rank)
        elif section == "optimizer_state":
            check_optimizer_with_state_refused()
        elif section == "checkpoints":
            check_checkpoints(workdir)
    accelerator.end_training()


if __name__ == "__main__":
    main()
