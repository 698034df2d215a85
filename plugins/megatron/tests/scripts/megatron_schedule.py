"""Launched in 2 processes by test_megatron_multiprocess.py; MEGATRON_MODE picks the run:

- ``pipeline``: pp_degree=2, num_micro_batches=4: a 4-layer model split in two stages of 2 layers; every
  ``model(batch)`` is one step of megatron-core's 1F1B schedule (real point-to-point send/recv over gloo);
  then save_state / load_state per pipeline stage and an exact resume;
- ``micro``: pp_degree=1, num_micro_batches=2 on 2 data-parallel shares: megatron-core's
  ``forward_backward_no_pipelining`` and its DistributedDataParallel averaging the shares;
- ``sequence``: tp_degree=2 with sequence_parallelism: a LayerNorm on the sequence shard, Column/Row parallel
  layers that all-gather / reduce-scatter along the sequence.

Every run installs cpu_device_shim first (in main) (a CPU-only torch; see that module for exactly what it changes).
Process 0 writes the initial and final full weights and the losses to ``$MEGATRON_OUT/<mode>.pt`` for the
test to compare with the same dense model trained by the ``local`` backend. Prints ``CHECK <name> ok``.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from parallel_mlp import column_row_forward, column_row_pair, full_column_row_weights

from drivetrain import Accelerator
from drivetrain.utils import (
    AbstractTrainStep,
    GPTTrainStep,
    MegatronLMDummyDataLoader,
    MegatronLMPlugin,
    avg_losses_across_data_parallel_group,
    set_seed,
)

HIDDEN, FFN, SEQ, LAYERS = 8, 16, 4, 4
STEPS = 3
CLIP = 0.5
ROWS = 48


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        print(f"CHECK {name} FAILED {detail}", flush=True)
        sys.exit(1)
    print(f"CHECK {name} ok", flush=True)


def dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(ROWS, SEQ, HIDDEN, generator=generator)
    y = torch.randn(ROWS, SEQ, HIDDEN, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def dense_layers() -> torch.nn.ModuleList:
    """The whole model's layers, identically initialised on every process (and in the test's dense run)."""
    set_seed(0)
    return torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS))


class Stage(torch.nn.Module):
    """One pipeline stage: its share of the layers; activations are [sequence, batch, hidden] (megatron-core's
    layout). The first stage reads the batch, the others the tensor the schedule received."""

    def __init__(self, config, layers: list[torch.nn.Module], first: bool) -> None:
        super().__init__()
        self.config = config
        self.layers = torch.nn.ModuleList(layers)
        self.first = first
        self.input_tensor: torch.Tensor | None = None

    def set_input_tensor(self, tensors) -> None:
        self.input_tensor = tensors[0] if isinstance(tensors, list) else tensors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.transpose(0, 1).contiguous() if self.first else self.input_tensor
        for layer in self.layers:
            hidden = torch.tanh(layer(hidden))
        return hidden


class RegressionStep(AbstractTrainStep):
    """batch (x, y) of [batch, sequence, hidden]; mean squared error on the last stage."""

    def __init__(self, megatron_args=None) -> None:
        super().__init__("RegressionStep")

    def get_batch_func(self):
        return lambda data_iterator: next(data_iterator)

    def get_loss_func(self):
        def loss_func(target: torch.Tensor, output: torch.Tensor):
            loss = torch.nn.functional.mse_loss(output, target.transpose(0, 1))
            return loss, {"mse": avg_losses_across_data_parallel_group([loss])[0]}

        return loss_func

    def get_forward_step_func(self):
        def forward_step(data_iterator, model):
            x, y = self.get_batch(data_iterator)
            return model(x), lambda output: self.loss_func(y, output)

        return forward_step


def stage_weights(model: torch.nn.Module, first_layer: int) -> dict[str, torch.Tensor]:
    return {
        f"{first_layer + index}.{name}": value.detach().clone()
        for index, layer in enumerate(model.layers)
        for name, value in layer.state_dict().items()
    }


def all_stage_weights(model: torch.nn.Module, first_layer: int) -> dict[str, torch.Tensor]:
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, stage_weights(model, first_layer))
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return merged


def run_scheduled(mode: str, out: str) -> None:
    pipeline = mode == "pipeline"
    micro_batches = 4 if pipeline else 2
    plugin = MegatronLMPlugin(
        pp_degree=2 if pipeline else 1,
        num_micro_batches=micro_batches,
        gradient_clipping=CLIP,
        seq_length=SEQ,
        custom_train_step_class=RegressionStep,
    )
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    stage = ps.get_pipeline_model_parallel_rank()
    stages = ps.get_pipeline_model_parallel_world_size()
    check("groups", ps.get_data_parallel_world_size() == (1 if pipeline else 2))
    per_stage = LAYERS // stages
    layers = dense_layers()
    config = plugin.model_parallel_config(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=1)
    model = Stage(config, list(layers)[stage * per_stage : (stage + 1) * per_stage], first=stage == 0)
    initial = all_stage_weights(model, stage * per_stage)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # one batch per step: micro_batches micro-batches of 2 rows
    loader = torch.utils.data.DataLoader(dataset(), batch_size=2 * micro_batches)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    check(
        "global_batch_size",
        plugin.micro_batch_size == 2
        and plugin.global_batch_size == 2 * micro_batches * (1 if pipeline else 2),
        f"{plugin.micro_batch_size} {plugin.global_batch_size}",
    )
    iterator = iter(loader)
    losses = []
    for _ in range(STEPS):
        x, y = next(iterator)
        loss = model(x, y)
        accelerator.backward(loss)  # a no-op: the schedule ran backward
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    check("loss_on_every_stage", all(value > 0 for value in losses), str(losses))
    unwrapped = accelerator.unwrap_model(model)
    final = all_stage_weights(unwrapped, stage * per_stage)

    # evaluation: forward only over the micro-batches, the same loss on every stage
    model.eval()
    with torch.no_grad():
        eval_loss = model(*next(iterator))
    model.train()
    seen = [torch.zeros(()) for _ in range(dist.get_world_size())]
    dist.all_gather(seen, eval_loss)
    check("eval_loss_on_every_stage", all(torch.equal(value, seen[0]) for value in seen), str(seen))
    if accelerator.is_main_process:
        torch.save({"initial": initial, "final": final, "losses": losses}, os.path.join(out, f"{mode}.pt"))

    if not pipeline:
        check_accumulation_across_calls(accelerator, model, optimizer)
    if os.environ.get("MEGATRON_DATA"):
        check_indexed_dataset_loaders(accelerator, os.environ["MEGATRON_DATA"], out)
        check_gpt_train_step_on_indexed_data(accelerator, plugin, os.environ["MEGATRON_DATA"], out)
    if pipeline:
        save_dir = os.path.join(out, "pipeline_checkpoint")
        batches = [next(iterator) for _ in range(2)]
        accelerator.save_state(save_dir)

        def train_on(pairs: list) -> None:
            for x, y in pairs:
                accelerator.backward(model(x, y))
                optimizer.step()
                optimizer.zero_grad()

        train_on(batches)
        first = [p.detach().clone() for p in unwrapped.parameters()]
        accelerator.load_state(save_dir)
        train_on(batches)
        again = [p.detach() for p in unwrapped.parameters()]
        check("resume_exact", all(torch.equal(a, b) for a, b in zip(first, again)))
        shard = os.path.join(save_dir, "megatron", f"mp_rank_00_{stage:03d}")
        check("checkpoint_per_stage", os.path.isfile(os.path.join(shard, "model_0.pt")), shard)
    accelerator.end_training()


def check_accumulation_across_calls(accelerator: Accelerator, model, optimizer) -> None:
    """gradient_accumulation_steps=2 over two scheduled calls: the first call's gradients stay local to each
    data-parallel share (megatron-core's finalize_model_grads is skipped), the second's are averaged, and they
    equal one call on both batches together (every micro-batch of equal size)."""
    x, y = dataset().tensors
    share = ps.get_data_parallel_rank()
    first = (x[share * 4 : share * 4 + 4], y[share * 4 : share * 4 + 4])
    second = (x[8 + share * 4 : 12 + share * 4], y[8 + share * 4 : 12 + share * 4])
    parameters = list(accelerator.unwrap_model(model).parameters())
    group = ps.get_data_parallel_group()

    def same_on_every_share() -> bool:
        flat = torch.cat([parameter.grad.reshape(-1) for parameter in parameters])
        shares = [torch.empty_like(flat) for _ in range(ps.get_data_parallel_world_size())]
        dist.all_gather(shares, flat, group=group)
        return all(torch.equal(part, flat) for part in shares)

    optimizer.zero_grad()
    accelerator.gradient_accumulation_steps = 2
    with accelerator.accumulate(model):
        model(*first)
    check("accumulate_keeps_gradients_local", not same_on_every_share())
    with accelerator.accumulate(model):
        model(*second)
    check("accumulate_averages_at_sync", same_on_every_share())
    accumulated = [parameter.grad.clone() for parameter in parameters]
    optimizer.zero_grad()
    accelerator.gradient_accumulation_steps = 1
    model(torch.cat([first[0], second[0]]), torch.cat([first[1], second[1]]))
    together = [parameter.grad for parameter in parameters]
    check(
        "accumulate_equals_one_call",
        all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(accumulated, together)),
    )
    optimizer.zero_grad()


def check_indexed_dataset_loaders(accelerator: Accelerator, prefix: str, out: str) -> None:
    """MegatronLMDummyDataLoader on an indexed dataset (.bin/.idx) the test wrote: megatron-core's GPT
    datasets split 6:1:1 by document, shared out over the data-parallel group; process 0 writes every split's
    samples as gather_for_metrics returns them (each sample once) and this rank's batch count."""
    loader = MegatronLMDummyDataLoader(
        data_path=prefix,
        splits_string="6,1,1",
        seq_length=4,
        micro_batch_size=1,
        eod_token=0,
        vocab_size=100,
        data_cache_path=os.path.join(out, "index_cache"),
    )
    loaders = accelerator.prepare(loader, loader, loader)
    seen: dict[str, list] = {}
    for name, split in zip(("train", "valid", "test"), loaders):
        rows = []
        for batch in split:
            tokens, labels, loss_mask, _, position_ids = GPTTrainStep().get_batch(iter([batch]))
            check(f"{name}_labels_shifted", torch.equal(labels[:, :-1], tokens[:, 1:]))
            rows.append(accelerator.gather_for_metrics(torch.cat([tokens, labels[:, -1:]], dim=1)))
        seen[name] = [row.tolist() for row in torch.cat(rows)] if rows else []
        seen[f"{name}_batches"] = len(split)
    if accelerator.is_main_process:
        torch.save(seen, os.path.join(out, "indexed.pt"))


class TinyLanguageModel(torch.nn.Module):
    """Embedding and a vocabulary-parallel head; called as GPTTrainStep calls megatron-core's GPTModel and,
    like it, returns per-token losses ([batch, sequence])."""

    VOCAB = 256

    def __init__(self, config) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(self.VOCAB, HIDDEN)
        self.head = tensor_parallel.ColumnParallelLinear(
            HIDDEN, self.VOCAB, config=config, init_method=torch.nn.init.xavier_normal_, bias=False
        )

    def forward(self, tokens, position_ids, attention_mask, labels=None):
        logits, _ = self.head(self.embedding(tokens).transpose(0, 1).contiguous())
        losses = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels.transpose(0, 1))
        return losses.transpose(0, 1).contiguous()


def check_gpt_train_step_on_indexed_data(accelerator, plugin, prefix: str, out: str) -> None:
    """GPTTrainStep (the default train step) through megatron-core's schedule on GPTDataset batches: the
    evaluation loss is the masked mean of the per-token losses over both micro-batches, averaged over the
    data-parallel shares, and a training step moves every share's weights alike."""
    plugin.custom_train_step_class = (
        None  # as Accelerate scripts set it on accelerator.state.megatron_lm_plugin
    )
    set_seed(0)
    model = TinyLanguageModel(plugin.model_parallel_config())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = MegatronLMDummyDataLoader(
        data_path=prefix,
        splits_string="6,1,1",
        seq_length=4,
        micro_batch_size=1,
        eod_token=0,
        vocab_size=256,
        data_cache_path=os.path.join(out, "index_cache"),
    )
    model, optimizer, train = accelerator.prepare(model, optimizer, loader)
    batch = next(iter(train))
    model.eval()
    with torch.no_grad():
        scheduled = model(**batch)
        by_hand = []
        for part in range(2):  # the schedule's two micro-batches of one sample
            sample = {key: value[part : part + 1] for key, value in batch.items()}
            per_token = accelerator.unwrap_model(model)(
                sample["tokens"], sample["position_ids"], sample["attention_mask"], labels=sample["labels"]
            )
            mask = sample["loss_mask"]
            by_hand.append((per_token * mask).sum() / mask.sum())
        expected = avg_losses_across_data_parallel_group([sum(by_hand) / 2])[0]
    check(
        "gpt_step_scheduled_loss",
        torch.allclose(scheduled.loss, expected, rtol=1e-6) and set(scheduled.losses) == {"lm loss"},
        f"{scheduled.loss} != {expected}",
    )
    model.train()
    before = accelerator.unwrap_model(model).embedding.weight.detach().clone()
    outputs = model(**batch)
    accelerator.backward(outputs.loss)
    optimizer.step()
    optimizer.zero_grad()
    after = accelerator.unwrap_model(model).embedding.weight.detach()
    shares = [torch.empty_like(after) for _ in range(ps.get_data_parallel_world_size())]
    dist.all_gather(shares, after.contiguous(), group=ps.get_data_parallel_group())
    check(
        "gpt_step_trains_shares_alike",
        not torch.equal(before, after) and all(torch.equal(share, after) for share in shares),
    )


class SequenceParallelMLP(torch.nn.Module):
    """LayerNorm on this rank's sequence shard, then Column/RowParallelLinear that all-gather the sequence
    before the first matmul and reduce-scatter it after the second."""

    def __init__(self, config) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)
        for parameter in self.norm.parameters():
            parameter.sequence_parallel = True  # megatron-core's mark: sees one sequence shard per rank
        self.up, self.down = column_row_pair(config, HIDDEN, FFN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shard = tensor_parallel.scatter_to_sequence_parallel_region(x.transpose(0, 1).contiguous())
        out = column_row_forward(self, self.norm(shard))
        # every rank computes the loss on the whole sequence: the gather's backward keeps this rank's part
        full = tensor_parallel.gather_from_sequence_parallel_region(out, tensor_parallel_output_grad=False)
        return full.transpose(0, 1)


def run_sequence_parallel(out: str) -> None:
    plugin = MegatronLMPlugin(tp_degree=2, sequence_parallelism=True, gradient_clipping=CLIP)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    set_seed(0)
    model = SequenceParallelMLP(plugin.model_parallel_config())
    check("sequence_parallel_config", model.up.sequence_parallel and model.down.sequence_parallel)
    group = ps.get_tensor_model_parallel_group()

    def full_weights(module: SequenceParallelMLP) -> dict[str, torch.Tensor]:
        return {
            "norm.weight": module.norm.weight.detach().clone(),
            "norm.bias": module.norm.bias.detach().clone(),
            **full_column_row_weights(module),
        }

    initial = full_weights(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _, (x, y) in zip(range(STEPS), loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    final = full_weights(accelerator.unwrap_model(model))
    norms = [torch.empty_like(final["norm.weight"]) for _ in range(2)]
    dist.all_gather(norms, final["norm.weight"], group=group)
    check("tp_ranks_agree_on_norm", torch.equal(norms[0], norms[1]))
    if accelerator.is_main_process:
        torch.save({"initial": initial, "final": final, "losses": losses}, os.path.join(out, "sequence.pt"))
    accelerator.end_training()


GPT_SEQ, GPT_VOCAB, GPT_ROWS = 8, 64, 16


def gpt_dataset() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(1, GPT_VOCAB, (GPT_ROWS, GPT_SEQ + 1), generator=generator)
    return [{"input_ids": row} for row in ids]


def build_gpt(plugin: MegatronLMPlugin, pre_process: bool, post_process: bool):
    """megatron-core's GPTModel (local layer spec, no dropout); each pipeline stage builds its own layers."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    config = plugin.model_parallel_config(
        num_layers=2, hidden_size=16, num_attention_heads=2, hidden_dropout=0.0, attention_dropout=0.0
    )
    set_seed(0)
    model_parallel_cuda_manual_seed(0)
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=GPT_VOCAB,
        max_sequence_length=GPT_SEQ,
        pre_process=pre_process,
        post_process=post_process,
    )


def gpt_states(model) -> list[dict[str, torch.Tensor]]:
    """Every stage's weights, in stage order (on every process)."""
    parts: list = [None] * dist.get_world_size()
    own = {name: value.detach().clone() for name, value in model.state_dict().items() if value is not None}
    dist.all_gather_object(parts, (ps.get_pipeline_model_parallel_rank(), own))
    return [state for _, state in sorted(parts, key=lambda part: part[0])]


def run_gpt_pipeline(out: str) -> None:
    """pp=2: megatron-core's GPTModel split in two stages (embedding + layer 0 | layer 1 + final norm + output
    layer; GPTModel's default of no weight shared between them), GPTTrainStep, 2 micro-batches per step."""
    plugin = MegatronLMPlugin(pp_degree=2, num_micro_batches=2, seq_length=GPT_SEQ, gradient_clipping=0)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    model = build_gpt(plugin, ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage())
    initial = gpt_states(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = torch.utils.data.DataLoader(gpt_dataset(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _, batch in zip(range(STEPS), loader):
        outputs = model(**batch)
        accelerator.backward(outputs.loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(outputs.loss.item())
    final = gpt_states(accelerator.unwrap_model(model))
    check("gpt_pipeline_trained", all(loss > 0 for loss in losses), str(losses))
    if accelerator.is_main_process:
        torch.save(
            {"initial": initial, "final": final, "losses": losses}, os.path.join(out, "gpt_pipeline.pt")
        )
    accelerator.end_training()


def stages_to_whole(stages: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The two stages' weights under one whole model's names (stage 1's layer 0 is the whole model's layer 1)."""
    whole = dict(stages[0])
    for name, value in stages[1].items():
        whole[name.replace("decoder.layers.0.", "decoder.layers.1.")] = value
    return whole


def run_gpt_reference(out: str) -> None:
    """The same GPT trained by hand in one process (no drivetrain, no schedule): the whole model from the
    pipeline run's initial weights, each step's 2 micro-batches' masked mean losses averaged, SGD."""
    dist.init_process_group("gloo")
    ps.initialize_model_parallel()
    plugin = MegatronLMPlugin().resolved()
    pipeline = torch.load(os.path.join(out, "gpt_pipeline.pt"))
    model = build_gpt(plugin, True, True)
    model.load_state_dict(stages_to_whole(pipeline["initial"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = torch.utils.data.DataLoader(gpt_dataset(), batch_size=2)
    step = GPTTrainStep()
    losses, step_loss = [], 0.0
    for index, batch in zip(range(STEPS * 2), batches):
        tokens, labels, loss_mask, attention_mask, position_ids = step.get_batch(iter([batch]))
        per_token = model(tokens, position_ids, attention_mask, labels=labels)
        loss = (per_token.float() * loss_mask).sum() / loss_mask.sum()
        (loss / 2).backward()
        step_loss += loss.item() / 2
        if index % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(step_loss)
            step_loss = 0.0
    final = {name: value.detach().clone() for name, value in model.state_dict().items() if value is not None}
    torch.save({"final": final, "losses": losses}, os.path.join(out, "gpt_reference.pt"))
    check("gpt_reference_trained", True)
    dist.destroy_process_group()


def main() -> None:
    # in the launched processes only (the test imports this module for its constants)
    sys.path.insert(0, os.path.dirname(__file__))
    import cpu_device_shim

    cpu_device_shim.install()
    mode, out = os.environ["MEGATRON_MODE"], os.environ["MEGATRON_OUT"]
    if mode == "sequence":
        run_sequence_parallel(out)
    elif mode == "gpt_pipeline":
        run_gpt_pipeline(out)
    elif mode == "gpt_reference":
        run_gpt_reference(out)
    else:
        run_scheduled(mode, out)


if __name__ == "__main__":
    main()
