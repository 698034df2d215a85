"""N-D layouts of the fsdp backend in real processes (gloo, CPU), several per launch (``reset_state`` between
them); see test_nd_parallelism.py. Every layout trains the model of nd_common.py and ends equal to the
`local` reference (REFERENCE, a torch.save of nd_common.train_local()).

Usage: nd_layouts.py SET WORKDIR REFERENCE [SEQUENCE_REFERENCE]
  SET four  (4 processes): tp2 x dp_shard2 (saves WORKDIR/tp_dp after step 3), dp_replicate2 x dp_shard2 and
            tp2 x dp_replicate2, both resuming that checkpoint, and the data-parallel views (gather_for_metrics)
  SET two   (2 processes): tp2 (and resuming the 4-process checkpoint), cp2, fsdp_version=1, and a
            transformers model's own tensor-parallel plan from DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE
  SET one   (1 process): the 4-process tensor-parallel checkpoint resumed without any parallelism
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

import torch
import torch.distributed as dist
from nd_common import (
    GLOBAL_BATCH,
    LR,
    MAX_NORM,
    SAVE_AFTER,
    SEQUENCE,
    STEPS,
    TOLERANCE,
    TP_PLAN,
    check,
    full_parameters,
    make_data,
    make_model,
    max_difference,
)
from torch.distributed.tensor import DTensor, Shard

from drivetrain import Accelerator, FullyShardedDataParallelPlugin, reset_state
from drivetrain.errors import ConfigurationError
from drivetrain.parallelism_config import ParallelismConfig
from drivetrain.utils import TorchTensorParallelConfig

WORKDIR = sys.argv[2]
REFERENCE = torch.load(sys.argv[3])


def plugin(**fields) -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"], **fields)


def tensor_parallel(**sizes) -> ParallelismConfig:
    return ParallelismConfig(tp_handler=TorchTensorParallelConfig(tp_plan=TP_PLAN), **sizes)


def start(parallelism, fsdp_plugin=None):
    """A fresh Accelerator for one layout (the mesh is built once per process state)."""
    reset_state()
    accelerator = Accelerator(fsdp_plugin=fsdp_plugin or plugin(), parallelism_config=parallelism)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def my_rows(accelerator, step: int) -> slice:
    """This process's rows of global step ``step``: its data-parallel share of the global batch."""
    options = accelerator.sharding_options(device_placement=False)
    per_share = GLOBAL_BATCH // options.num_processes
    first = step * GLOBAL_BATCH + options.process_index * per_share
    return slice(first, first + per_share)


def train(accelerator, model, optimizer, steps, sequence=False, loader=None, save_to=None):
    """Train ``steps`` (from the prepared ``loader`` when given, else this process's rows); returns the
    clipping norms."""
    inputs, targets = make_data(sequence)
    batches = iter(loader) if loader is not None else None
    norms = []
    for step in steps:
        if batches is not None:
            x, y = next(batches)
        else:
            x, y = inputs[my_rows(accelerator, step)], targets[my_rows(accelerator, step)]
        context = (
            accelerator.maybe_context_parallel(buffers=[x, y], buffer_seq_dims=[1, 1])
            if sequence
            else contextlib.nullcontext()
        )
        with context:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)))
        optimizer.step()
        optimizer.zero_grad()
        if save_to is not None and step + 1 == SAVE_AFTER:
            accelerator.save_state(save_to)
    return norms


def loader_of(accelerator, sequence=False):
    inputs, targets = make_data(sequence)
    shares = accelerator.sharding_options(device_placement=False).num_processes
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    return accelerator.prepare(torch.utils.data.DataLoader(dataset, batch_size=GLOBAL_BATCH // shares))


def check_equal(name: str, model, expected, norms=None, reference_norms=None) -> None:
    difference = max_difference(full_parameters(model), expected)
    check(f"{name}_equals_local", difference < TOLERANCE, f"max weight difference {difference}")
    if norms is not None:
        worst = max(abs(a - b) for a, b in zip(norms, reference_norms))
        check(f"{name}_clip_norm_equals_local", worst < 1e-4, f"{norms} vs local {reference_norms}")


def same_across(group_ranks: list[int], value) -> bool:
    """Whether every rank of ``group_ranks`` holds the same ``value`` (collective over every rank)."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return len({repr(values[rank]) for rank in group_ranks}) == 1


def batch_signature(loader) -> list[float]:
    return [round(float(x.sum()), 4) for x, _ in loader]


def resume(name, parallelism, fsdp_plugin=None) -> None:
    """Load the 4-process tp2 x dp_shard2 checkpoint into this layout and finish the run."""
    accelerator, model, optimizer = start(parallelism, fsdp_plugin)
    accelerator.load_state(os.path.join(WORKDIR, "tp_dp"))
    check_equal(f"{name}_loaded", model, REFERENCE["after_save"])
    norms = train(accelerator, model, optimizer, range(SAVE_AFTER, STEPS))
    check_equal(f"{name}_resumed", model, REFERENCE["final"], norms, REFERENCE["norms"][SAVE_AFTER:])


# -- 4 processes ------------------------------------------------------------------------------------------------
def four() -> None:
    # tp2 x dp_shard2: ranks (0, 1) and (2, 3) are tensor-parallel pairs; data is split between the pairs.
    accelerator, model, optimizer = start(tensor_parallel(tp_size=2, dp_shard_size=2))
    rank = dist.get_rank()
    loader = loader_of(accelerator)
    norms = train(
        accelerator, model, optimizer, range(STEPS), loader=loader, save_to=os.path.join(WORKDIR, "tp_dp")
    )
    check_equal("tp2_dp_shard2", model, REFERENCE["final"], norms, REFERENCE["norms"])
    up = dict(model.named_parameters())["blocks.0.up.weight"]
    check(
        "tp2_dp_shard2_weight_2d",
        isinstance(up, DTensor)
        and up.device_mesh.ndim == 2
        and up.device_mesh.mesh_dim_names[-1] == "tp"
        and up.to_local().numel() == up.numel() // 4,
        f"{type(up).__name__} {getattr(up, 'placements', '')} {up.device_mesh} local {up.to_local().shape}",
    )
    signature = batch_signature(loader)
    pair, other = [rank - rank % 2, rank - rank % 2 + 1], [(rank + 2) % 4]
    check("tp2_dp_shard2_pair_sees_same_batches", same_across(pair, signature))
    check("tp2_dp_shard2_shares_differ", not same_across([rank, *other], signature))
    check(
        "tp2_dp_shard2_coordinates",
        (accelerator.num_processes, accelerator.tensor_parallel_rank, accelerator.data_parallel_shard_rank)
        == (4, rank % 2, rank // 2),
        str(
            (
                accelerator.num_processes,
                accelerator.tensor_parallel_rank,
                accelerator.data_parallel_shard_rank,
            )
        ),
    )
    # 10 samples over 2 data-parallel shares, batches of 3: each sample once, as in plain data parallelism.
    evaluation = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(10), batch_size=3))
    seen = torch.cat([accelerator.gather_for_metrics(batch) for batch in evaluation]).tolist()
    check("gather_for_metrics_each_sample_once", sorted(seen) == list(range(10)), str(seen))
    check("gather_counts_every_rank", accelerator.gather(torch.tensor([rank])).tolist() == [0, 1, 2, 3])

    # HSDP: dp_replicate2 x dp_shard2, resuming the tensor-parallel checkpoint (DCP reshards it).
    accelerator, model, optimizer = start(ParallelismConfig(dp_replicate_size=2, dp_shard_size=2))
    embed = dict(model.named_parameters())["embed.weight"]
    check(
        "hsdp_holds_half_replicated",
        embed.to_local().numel() == embed.numel() // 2
        and same_across([rank % 2, rank % 2 + 2], embed.to_local().tolist()),
    )
    accelerator.load_state(os.path.join(WORKDIR, "tp_dp"))
    check_equal("hsdp_loaded", model, REFERENCE["after_save"])
    norms = train(accelerator, model, optimizer, range(SAVE_AFTER, STEPS))
    check_equal("hsdp_resumed", model, REFERENCE["final"], norms, REFERENCE["norms"][SAVE_AFTER:])

    # tp2 x dp_replicate2: tensor parallelism with plain (replicated) data parallelism.
    resume("tp2_dp_replicate2", tensor_parallel(tp_size=2, dp_replicate_size=2))

    reset_state()
    try:
        Accelerator(fsdp_plugin=plugin(), parallelism_config=ParallelismConfig(tp_size=2, dp_shard_size=3))
        raised = ""
    except ConfigurationError as exc:
        raised = str(exc)
    check("sizes_not_matching_world_refused", "multiply to 6" in raised and "4 processes" in raised, raised)


# -- 2 processes ------------------------------------------------------------------------------------------------
def two() -> None:
    accelerator, model, optimizer = start(tensor_parallel(tp_size=2))
    rank = dist.get_rank()
    loader = loader_of(accelerator)
    norms = train(accelerator, model, optimizer, range(STEPS), loader=loader)
    check_equal("tp2", model, REFERENCE["final"], norms, REFERENCE["norms"])
    up = dict(model.named_parameters())["blocks.0.up.weight"]
    check(
        "tp2_weight_split_by_rows",
        isinstance(up, DTensor)
        and up.placements == (Shard(0),)
        and up.to_local().shape[0] == up.shape[0] // 2,
    )
    check("tp2_both_ranks_see_every_batch", same_across([0, 1], batch_signature(loader)))
    check(
        "tp2_tensor_parallel_rank",
        accelerator.tensor_parallel_rank == rank and accelerator.num_processes == 2,
    )
    resume("tp2", tensor_parallel(tp_size=2))

    # Context parallelism: each rank holds half of every sequence inside maybe_context_parallel.
    sequence_reference = torch.load(sys.argv[4])
    accelerator, model, optimizer = start(ParallelismConfig(cp_size=2))
    x = torch.randn(2, SEQUENCE, 6)
    with accelerator.maybe_context_parallel(buffers=[x], buffer_seq_dims=[1]):
        inside = tuple(x.shape)
    check("cp2_shards_the_sequence", inside == (2, SEQUENCE // 2, 6) and tuple(x.shape) == (2, SEQUENCE, 6))
    norms = train(accelerator, model, optimizer, range(STEPS), sequence=True)
    difference = max_difference(full_parameters(model), sequence_reference["final"])
    check("cp2_equals_local", difference < TOLERANCE, f"max weight difference {difference}")
    q = torch.randn(1, 2, SEQUENCE, 4)
    try:
        with accelerator.maybe_context_parallel(buffers=[q], buffer_seq_dims=[2]):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        raised = ""
    except ConfigurationError as exc:
        raised = str(exc)
    check("cp2_attention_on_cpu_refused", "CUDA" in raised and "ring attention" in raised, raised)

    fsdp1_layouts()
    llama_tensor_parallel()


def fsdp1_layouts() -> None:
    """FSDP1: torch's FullyShardedDataParallel, SHARDED and FULL checkpoints."""
    for kind in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        fsdp1 = plugin(fsdp_version=1, state_dict_type=kind)
        accelerator, model, optimizer = start(None, fsdp1)
        from torch.distributed.fsdp import FullyShardedDataParallel

        check(f"fsdp1_{kind}_wrapper", isinstance(model, FullyShardedDataParallel))
        folder = os.path.join(WORKDIR, f"fsdp1_{kind}")
        norms = train(accelerator, model, optimizer, range(STEPS), save_to=folder)
        check_equal(f"fsdp1_{kind}", model, REFERENCE["final"], norms, REFERENCE["norms"])
        accelerator, model, optimizer = start(None, plugin(fsdp_version=1, state_dict_type=kind))
        accelerator.load_state(folder)
        check_equal(f"fsdp1_{kind}_loaded", model, REFERENCE["after_save"])
        norms = train(accelerator, model, optimizer, range(SAVE_AFTER, STEPS))
        check_equal(
            f"fsdp1_{kind}_resumed", model, REFERENCE["final"], norms, REFERENCE["norms"][SAVE_AFTER:]
        )


def llama_tensor_parallel() -> None:
    """A transformers model's own plan, the tensor-parallel size from the environment (as `drivetrain launch
    --parallelism_config_tp_size 2` exports it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        attn_implementation="eager",
    )
    tokens = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(3))

    def build():
        torch.manual_seed(0)
        return LlamaForCausalLM(config)

    reference = build()
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=0.01)
    for _ in range(3):
        reference(input_ids=tokens, labels=tokens).loss.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()

    reset_state()
    os.environ["DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE"] = "2"
    try:
        accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
        model = build()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
        check("llama_tp_from_environment", accelerator.parallelism_config.tp_size == 2)
        for _ in range(3):
            accelerator.backward(model(input_ids=tokens, labels=tokens).loss)
            optimizer.step()
            optimizer.zero_grad()
        q_proj = dict(model.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
        check("llama_own_plan_applied", isinstance(q_proj, DTensor) and Shard(0) in q_proj.placements)
        difference = max_difference(full_parameters(model), full_parameters(reference))
        check("llama_tp2_equals_local", difference < 1e-4, f"max weight difference {difference}")
    finally:
        del os.environ["DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE"]


# -- 1 process --------------------------------------------------------------------------------------------------
def one() -> None:
    resume("one_process", None)
    accelerate_helpers()
    activation_checkpointing_offload()


def accelerate_helpers() -> None:
    """Accelerate's module-level helpers and ``AcceleratorState().fsdp_plugin``, which drives what they and
    ``save_state`` write."""
    from drivetrain import AcceleratorState
    from drivetrain.utils import (
        fsdp2_load_full_state_dict,
        fsdp2_prepare_model,
        load_fsdp_model,
        load_fsdp_optimizer,
        save_fsdp_model,
        save_fsdp_optimizer,
    )

    accelerator, model, optimizer = start(None)
    fsdp_plugin = AcceleratorState().fsdp_plugin
    check(
        "state_fsdp_plugin_is_the_runs",
        fsdp_plugin is accelerator.state.fsdp_plugin and fsdp_plugin.min_num_params == 0,
    )
    train(accelerator, model, optimizer, range(SAVE_AFTER))
    for kind, written in (
        ("SHARDED_STATE_DICT", "pytorch_model_fsdp_0"),
        ("FULL_STATE_DICT", "pytorch_model_fsdp.bin"),
    ):
        folder = os.path.join(WORKDIR, f"helpers_{kind}")
        fsdp_plugin.set_state_dict_type(kind)
        save_fsdp_model(fsdp_plugin, accelerator, model, folder)
        save_fsdp_optimizer(fsdp_plugin, accelerator, optimizer, model, folder)
        check(f"helpers_{kind}_files", os.path.exists(os.path.join(folder, written)), str(os.listdir(folder)))
        fresh = make_model()
        fresh, fresh_optimizer = accelerator.prepare(fresh, torch.optim.AdamW(fresh.parameters(), lr=LR))
        load_fsdp_model(fsdp_plugin, accelerator, fresh, folder)
        load_fsdp_optimizer(fsdp_plugin, accelerator, fresh_optimizer, fresh, folder)
        check_equal(f"helpers_{kind}_loaded", fresh, REFERENCE["after_save"])
        norms = train(accelerator, fresh, fresh_optimizer, range(SAVE_AFTER, STEPS))
        check_equal(
            f"helpers_{kind}_resumed", fresh, REFERENCE["final"], norms, REFERENCE["norms"][SAVE_AFTER:]
        )
    # The state's plugin is the one save_state follows: switched to FULL above, it writes one file.
    accelerator.save_state(os.path.join(WORKDIR, "state_full"))
    accelerator.wait_for_checkpoint()  # the folder gets its final name once the save is complete
    check(
        "set_state_dict_type_drives_save_state",
        os.path.exists(os.path.join(WORKDIR, "state_full", "model.safetensors")),
    )

    sharded = fsdp2_prepare_model(accelerator, make_model())
    from torch.distributed.fsdp import FSDPModule

    check("fsdp2_prepare_model_shards", isinstance(sharded, FSDPModule))
    fsdp2_load_full_state_dict(accelerator, sharded, REFERENCE["after_save"])
    check_equal("fsdp2_load_full_state_dict", sharded, REFERENCE["after_save"])


def activation_checkpointing_offload() -> None:
    """Offloading what checkpointed units save keeps training equal, and really goes through save_on_cpu."""
    entered = []
    original = torch.autograd.graph.save_on_cpu

    def counting(*args, **kwargs):
        entered.append(1)
        return original(*args, **kwargs)

    torch.autograd.graph.save_on_cpu = counting
    try:
        accelerator, model, optimizer = start(
            None, plugin(activation_checkpointing=True, activation_checkpointing_offload=True)
        )
        norms = train(accelerator, model, optimizer, range(STEPS))
    finally:
        torch.autograd.graph.save_on_cpu = original
    check_equal("activation_checkpointing_offload", model, REFERENCE["final"], norms, REFERENCE["norms"])
    check("activation_checkpointing_offload_used_save_on_cpu", len(entered) == 2 * STEPS, str(len(entered)))


def main() -> None:
    torch.set_num_threads(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        {"four": four, "two": two, "one": one}[sys.argv[1]]()
    # torch 2.11+ deprecates slicing a flattened mesh dimension (dp, dp_shard_cp, dp_cp) from the root mesh;
    # the kernel and the plugin reach those through ParallelismConfig.submesh instead.
    sliced = [str(w.message) for w in caught if "flattened dim" in str(w.message)]
    check("no_flattened_mesh_slicing_warning", not sliced, "; ".join(sliced[:2]))
    reset_state(destroy_process_group=True)


if __name__ == "__main__":
    main()
