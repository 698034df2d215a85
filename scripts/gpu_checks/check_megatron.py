"""Check 5 (one process under torch.distributed.run; argument: the mode):

- ``scheduled``: megatron-core's GPTModel (local layer spec, tiny config) with the default GPTTrainStep,
  tp=1 pp=1, num_micro_batches=2 through megatron-core's schedule: the loss falls and the weights equal the same
  model trained by hand (mean of the two micro-batch losses) within 1e-4;
- ``plain``: the same with num_micro_batches=1 (the plain tp=1 path);
- ``distopt``: use_distributed_optimizer=True: reports whether drivetrain-megatron still refuses it (its
  refusal names CUDA; on a GPU megatron-core's optimizer could run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from common import device_or_exit, run_checks

VOCAB, SEQ, HIDDEN, LAYERS, HEADS = 128, 16, 64, 2, 4
STEPS = 8


def build(plugin):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = plugin.model_parallel_config(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
    )


def token_batches(batch: int) -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    # a learnable pattern: each sequence counts up from a random start
    starts = torch.randint(0, VOCAB, (STEPS, batch, 1), generator=generator)
    sequences = (starts + torch.arange(SEQ + 1)) % VOCAB
    return [{"input_ids": sequences[step]} for step in range(STEPS)]


def hand_loss(model, input_ids: torch.Tensor, device) -> torch.Tensor:
    tokens, labels = input_ids[:, :-1].to(device), input_ids[:, 1:].to(device)
    mask = torch.tril(torch.ones(1, 1, SEQ, SEQ, device=device)) < 0.5
    positions = torch.arange(SEQ, device=device).unsqueeze(0).expand_as(tokens)
    return model(tokens, positions, mask, labels=labels).float().mean()


def main() -> int:
    mode = sys.argv[1]
    device = device_or_exit(f"megatron_{mode}")
    try:
        import megatron.core  # noqa: F401
    except ImportError as error:
        print(f"RESULT megatron_{mode} SKIP 0 megatron-core not importable: {error}", flush=True)
        return 0
    if device.type == "cpu":
        # CPU dry run only: the megatron tests' shim lets megatron-core's CUDA-bound schedule run on CPU
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins/megatron/tests/scripts"))
        import cpu_device_shim

        cpu_device_shim.install()
    from drivetrain import Accelerator
    from drivetrain.utils import MegatronLMPlugin, set_seed

    micro = 2 if mode == "scheduled" else 1
    state: dict = {}

    def setup():
        plugin = MegatronLMPlugin(
            num_micro_batches=micro,
            seq_length=SEQ,
            use_distributed_optimizer=mode == "distopt",
            gradient_clipping=0.0,
        )
        state["accelerator"] = Accelerator(megatron_lm_plugin=plugin)
        set_seed(0)
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(0)  # GPTModel's attention forks this RNG state
        state["model"] = build(plugin).to(device)
        # a second instance with the same weights (megatron modules hold process groups: no deepcopy)
        state["by_hand"] = build(plugin).to(device)
        state["by_hand"].load_state_dict(state["model"].state_dict())
        state["optimizer"] = torch.optim.SGD(state["model"].parameters(), lr=0.05)
        state["batches"] = token_batches(2 * micro)
        rows = [batch["input_ids"][row] for batch in state["batches"] for row in range(2 * micro)]
        state["loader"] = torch.utils.data.DataLoader(rows, batch_size=2 * micro)
        return True, 0, "Accelerator(megatron_lm_plugin=...) and GPTModel built"

    code = run_checks([(f"megatron_{mode}_setup", setup)])
    if code:
        return code
    accelerator, model, by_hand = state["accelerator"], state["model"], state["by_hand"]
    optimizer, batches, loader = state["optimizer"], state["batches"], state["loader"]

    if mode == "distopt":

        def refused():
            try:
                accelerator.prepare(model, optimizer, loader)
            except Exception as error:
                return True, 1, f"still refused ({type(error).__name__}): {str(error)[:160]}"
            return True, 0, "NOT refused any more: prepare accepted use_distributed_optimizer=True"

        return run_checks([("megatron_distributed_optimizer_refusal", refused)])

    def trains():
        prepared, prepared_optimizer, prepared_loader = accelerator.prepare(model, optimizer, loader)
        losses = []
        for batch in prepared_loader:
            if micro > 1:  # the schedule: GPTTrainStep cuts the batch into micro-batches
                loss = prepared(input_ids=batch).loss
            else:  # the plain path: the prepared model is called as the user's model
                loss = hand_loss(prepared, batch, device)
            accelerator.backward(loss)
            prepared_optimizer.step()
            prepared_optimizer.zero_grad()
            losses.append(float(loss))
        hand_optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.05)
        for batch in batches:
            parts = batch["input_ids"].chunk(micro)
            loss = sum(hand_loss(by_hand, part, device) for part in parts) / micro
            loss.backward()
            hand_optimizer.step()
            hand_optimizer.zero_grad()
        ours = accelerator.unwrap_model(prepared).state_dict()
        theirs = by_hand.state_dict()
        keys = [k for k, v in theirs.items() if isinstance(v, torch.Tensor) and k in ours]
        diff = max(float((ours[k].float() - theirs[k].float()).abs().max()) for k in keys)
        ok = losses[-1] < losses[0] and diff < 1e-4 and len(keys) > 0
        return (
            ok,
            diff,
            (
                f"max |drivetrain - hand| weight after {STEPS} steps over {len(keys)} tensors (pass < 1e-4); "
                f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; num_micro_batches={micro}, device={device}"
            ),
        )

    code = run_checks([(f"megatron_gpt_{mode}_tp1", trains)])
    accelerator.end_training()
    return code


if __name__ == "__main__":
    sys.exit(main())
