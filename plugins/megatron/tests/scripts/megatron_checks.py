"""Launched in 2 (tp=2) or 4 (tp=2 x dp=2) processes by test_megatron_multiprocess.py.

Trains a model of megatron-core ColumnParallelLinear/RowParallelLinear layers through the Accelerator and
writes, from process 0, the initial and final full weights and the losses to ``$MEGATRON_OUT/<name>.pt`` so
that the test can train the same dense model with the ``local`` backend and compare. Prints ``CHECK <name> ok``
for each property checked here.

Environment: MEGATRON_OUT (folder), MEGATRON_TP (tensor degree), MEGATRON_SAVE (checkpoint folder to write),
MEGATRON_FOREIGN (a checkpoint saved with other degrees, to be refused).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from parallel_mlp import column_row_forward, column_row_pair, full_column_row_weights

from drivetrain import Accelerator
from drivetrain.errors import CheckpointError
from drivetrain.utils import MegatronLMPlugin, avg_losses_across_data_parallel_group, set_seed

STEPS = 4
HIDDEN, FFN = 8, 16
BATCH = 4  # per data-parallel share
CLIP = 0.5


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        print(f"CHECK {name} FAILED {detail}", flush=True)
        sys.exit(1)
    print(f"CHECK {name} ok", flush=True)


class TensorParallelMLP(torch.nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.up, self.down = column_row_pair(config, HIDDEN, FFN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_row_forward(self, x)


def dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(64, HIDDEN, generator=generator)
    y = torch.randn(64, HIDDEN, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def main() -> None:
    out = os.environ["MEGATRON_OUT"]
    tp = int(os.environ["MEGATRON_TP"])
    plugin = MegatronLMPlugin(tp_degree=tp, gradient_clipping=CLIP)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    world = accelerator.num_processes
    check(
        "distributed_type",
        accelerator.distributed_type.value == "MEGATRON_LM",
        accelerator.distributed_type.value,
    )
    check("state_plugin_is_script_object", accelerator.state.megatron_lm_plugin is plugin)
    check(
        "groups",
        ps.get_tensor_model_parallel_world_size() == tp and ps.get_data_parallel_world_size() == world // tp,
        f"{ps.get_tensor_model_parallel_world_size()} {ps.get_data_parallel_world_size()}",
    )
    set_seed(0)
    model = TensorParallelMLP(plugin.model_parallel_config())
    initial = full_column_row_weights(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    check(
        "global_batch_size", plugin.global_batch_size == BATCH * (world // tp), str(plugin.global_batch_size)
    )
    check("batches_per_share", len(loader) == 64 // (BATCH * (world // tp)), str(len(loader)))

    losses = []
    iterator = iter(loader)
    for step in range(STEPS):
        x, y = next(iterator)
        # every tensor-parallel peer sees the same batch; data-parallel shares differ
        seen = [torch.empty_like(x) for _ in range(tp)]
        dist.all_gather(seen, x, group=ps.get_tensor_model_parallel_group())
        if step == 0:
            check("tp_peers_same_batch", all(torch.equal(part, x) for part in seen))
            shares = accelerator.gather(x[:1])
            distinct = {tuple(row.tolist()) for row in shares}
            check("dp_shares_differ", len(distinct) == world // tp, str(len(distinct)))
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(avg_losses_across_data_parallel_group([loss])[0].item())

    # gather_for_metrics over the data-parallel shares: 10 samples come back exactly once each
    eval_x = torch.arange(10, dtype=torch.float32).unsqueeze(1).repeat(1, HIDDEN)
    eval_loader = accelerator.prepare(
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(eval_x), batch_size=3)
    )
    seen_rows = []
    for (batch,) in eval_loader:
        seen_rows.append(accelerator.gather_for_metrics(batch[:, 0]))
    values = torch.cat(seen_rows).tolist()
    check("gather_for_metrics_dp_once", sorted(values) == [float(i) for i in range(10)], str(values))
    reduced = accelerator.reduce(torch.tensor([float(ps.get_data_parallel_rank())]), reduction="sum")
    expected = tp * sum(range(world // tp))
    check("reduce_over_all_processes", reduced.item() == expected, f"{reduced.item()} != {expected}")

    # a prepared scheduler advances once per data-parallel share per step (tensor-parallel peers shared a batch)
    probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    probe, schedule = accelerator.prepare(probe, torch.optim.lr_scheduler.LambdaLR(probe, lambda step: 1.0))
    probe.step()
    schedule.step()
    check(
        "scheduler_steps_per_share",
        schedule.scheduler.last_epoch == world // tp,
        str(schedule.scheduler.last_epoch),
    )

    final = full_column_row_weights(model.module if hasattr(model, "module") else model)
    if accelerator.is_main_process:
        torch.save(
            {"initial": initial, "final": final, "losses": losses}, os.path.join(out, f"train_{world}.pt")
        )

    # checkpoints: exact resume
    save_dir = os.environ.get("MEGATRON_SAVE")
    if save_dir:
        batches = [next(iterator) for _ in range(2)]
        accelerator.save_state(save_dir)

        def train_on(pairs: list) -> None:
            for x, y in pairs:
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()

        train_on(batches)
        first = [p.detach().clone() for p in model.parameters()]
        accelerator.load_state(save_dir)
        train_on(batches)
        again = [p.detach() for p in model.parameters()]
        check("resume_exact", all(torch.equal(a, b) for a, b in zip(first, again)))
        shard = os.path.join(save_dir, "megatron", f"mp_rank_{ps.get_tensor_model_parallel_rank():02d}_000")
        check("checkpoint_per_tp_rank", os.path.isdir(shard), shard)

    foreign = os.environ.get("MEGATRON_FOREIGN")
    if foreign:
        try:
            accelerator.load_state(foreign)
        except CheckpointError as exc:
            # Refused before anything changes: by the kernel's check of the data loader records (the global
            # batch differs when the data-parallel degree does), or by megatron's own check of the degrees.
            refused = "dp_degree 1 -> 2" in str(exc) or (
                "dl_state_dict.bin: data loader state was saved with total_batch_size=4 but this loader has "
                "total_batch_size=8" in str(exc)
            )
            check("other_degrees_refused", refused, str(exc))
        else:
            check("other_degrees_refused", False, "loaded a checkpoint saved with other degrees")
    accelerator.end_training()


if __name__ == "__main__":
    main()
