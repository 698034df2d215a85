"""What users of transformers, peft and trl do most, on a tiny GPT-2 built from a config and a tokenizer trained
here (no hub): one module shared by the tests (in-process and under ``accelerate launch``), the reference runs
(the same file in a virtualenv with HuggingFace Accelerate) and bench/hf_trainer_step.py.

    python hf_scenarios.py trainer --out result.json [--max-steps 30] [--stop-at 15] [--resume DIR] [--bf16]
        [--batch 4] [--deepspeed CONFIG.json] [--fsdp] [--workdir DIR]
    python hf_scenarios.py lora|sft|device_map --out result.json --workdir DIR

Every scenario writes a JSON result on process 0: the losses logged at each step, the eval loss, the
global step, a sha256 of the final weights, and what the scenario checks (which weights changed, where the
device map put them, ...). It imports ``accelerate`` only through transformers/peft/trl, as users do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

WORDS = (
    "the a one two red blue green cat dog bird runs jumps sleeps eats fast slow big small tree house river "
    "sun moon star sees likes near far under over and then"
).split()
BLOCK = 32  # tokens per training example


def corpus(lines: int, seed: int = 0) -> list[str]:
    """Sentences from a small grammar-free vocabulary: enough structure for a loss that goes down."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        start = rng.randrange(len(WORDS))
        # a repeating walk through the word list with a little noise: predictable for a tiny model
        out.append(" ".join(WORDS[(start + i * 3 + (rng.random() < 0.1)) % len(WORDS)] for i in range(40)))
    return out


def build_tokenizer(workdir: Path) -> Any:
    """A word-level tokenizer trained on the corpus with the tokenizers library, as transformers'
    PreTrainedTokenizerFast. Training is deterministic, so every process builds the same one itself."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        corpus(200), trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[EOS]"])
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )


class Blocks:
    """Fixed-length causal-LM examples (no padding, so every process's mean loss weighs tokens alike)."""

    def __init__(self, tokenizer: Any, lines: list[str]) -> None:
        import torch

        ids = [token for line in lines for token in tokenizer(line)["input_ids"]]
        count = len(ids) // BLOCK
        self.data = torch.tensor(ids[: count * BLOCK]).view(count, BLOCK)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.data[index]
        return {"input_ids": row, "attention_mask": row.new_ones(row.shape), "labels": row.clone()}


def tiny_gpt2(tokenizer: Any, seed: int = 0, **sizes: int) -> Any:
    """GPT2Config(n_layer=2, n_embd=32) and the tokenizer's vocabulary, unless ``sizes`` says otherwise."""
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(seed)
    config = GPT2Config(
        n_layer=sizes.get("n_layer", 2),
        n_embd=sizes.get("n_embd", 32),
        n_head=2,
        n_positions=64,
        vocab_size=sizes.get("vocab_size", len(tokenizer)),
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def step_losses(log_history: list[dict[str, Any]]) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in log_history if "loss" in entry}


def training_arguments(args: argparse.Namespace, **extra: Any) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(args.workdir / "out"),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=args.lr,
        warmup_steps=2,
        logging_steps=1,
        eval_strategy="no",
        save_strategy="steps",
        save_steps=args.save_steps,
        seed=42,
        report_to="none",
        use_cpu=True,
        bf16=args.bf16,
        dataloader_num_workers=0,
        disable_tqdm=True,
        deepspeed=args.deepspeed,
        fsdp="full_shard auto_wrap" if args.fsdp else "",
        fsdp_config={"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"]}
        if args.fsdp
        else None,
        **extra,
    )


def run_trainer(args: argparse.Namespace) -> dict[str, Any]:
    """Train (gradient accumulation 2), evaluate, save; ``--stop-at N`` stops after the checkpoint of step N
    (an interrupted run), ``--resume DIR`` continues from a checkpoint."""
    import torch
    from transformers import Trainer, TrainerCallback

    tokenizer = build_tokenizer(args.workdir)
    train, evaluation = Blocks(tokenizer, corpus(240, seed=1)), Blocks(tokenizer, corpus(24, seed=2))
    model = tiny_gpt2(tokenizer)
    seen_dtypes: set[str] = set()

    def record_dtype(module: Any, inputs: Any, output: Any) -> None:
        seen_dtypes.add(str(output.dtype))

    model.lm_head.register_forward_hook(record_dtype)

    # (CPU seconds of this process, wall seconds) from one optimizer step's end to the next: loading the
    # batches, forward and backward of each, the optimizer step, logging (bench/hf_trainer_step.py)
    step_times: list[tuple[float, float]] = []

    class StopAt(TrainerCallback):
        def on_train_begin(self, arguments: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.last = (time.process_time(), time.perf_counter())

        def on_step_end(self, arguments: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            now = (time.process_time(), time.perf_counter())
            step_times.append((now[0] - self.last[0], now[1] - self.last[1]))
            self.last = now
            if args.stop_at and state.global_step >= args.stop_at:
                control.should_save = True
                control.should_training_stop = True
            return control

    trainer = Trainer(
        model=model,
        args=training_arguments(args),
        train_dataset=train,
        eval_dataset=evaluation,
        callbacks=[StopAt()],
    )
    trainer.train(resume_from_checkpoint=str(args.resume) if args.resume else None)
    metrics = trainer.evaluate()
    trainer.save_model(str(args.workdir / "final"))
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    state = trainer.accelerator.get_state_dict(trainer.model)
    result = {
        "losses": step_losses(trainer.state.log_history),
        "eval_loss": metrics["eval_loss"],
        "global_step": trainer.state.global_step,
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "lm_head_output_dtypes": sorted(seen_dtypes),
        "weights_sha256": weights_digest(state) if state is not None else None,
        "checkpoints": sorted(p.name for p in (args.workdir / "out").glob("checkpoint-*")),
        "accelerate_module": sys.modules["accelerate"].__name__,
        "accelerate_version": __import__("accelerate").__version__,
        "model_class": type(unwrapped).__name__,
        "step_cpu_seconds": [cpu for cpu, _ in step_times],
        "step_wall_seconds": [wall for _, wall in step_times],
        "torch": torch.__version__,
    }
    return result


def weights_digest(state: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def run_lora(args: argparse.Namespace) -> dict[str, Any]:
    """peft LoRA on the attention projections through Trainer: the base weights stay, the adapters learn, and
    the saved adapter loads back to the same outputs."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import Trainer

    tokenizer = build_tokenizer(args.workdir)
    train = Blocks(tokenizer, corpus(120, seed=1))
    base = tiny_gpt2(tokenizer)
    before = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0))
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    trainer = Trainer(model=model, args=training_arguments(args), train_dataset=train)
    trainer.train()
    folder = args.workdir / "adapter"
    trainer.save_model(str(folder))
    trained = trainer.accelerator.unwrap_model(trainer.model)
    base_after = trained.get_base_model().state_dict()
    base_unchanged = all(
        torch.equal(base_after[name], tensor)
        for name, tensor in before.items()
        if name in base_after and "lora_" not in name
    )
    lora_changed = sum(
        not torch.equal(p.detach(), lora_before[n]) for n, p in trained.named_parameters() if "lora_" in n
    )
    sample = train[0]["input_ids"][None]
    trained.eval()
    with torch.no_grad():
        expected = trained(sample).logits
        reloaded = PeftModel.from_pretrained(tiny_gpt2(tokenizer), str(folder)).eval()
        actual = reloaded(sample).logits
    return {
        "losses": step_losses(trainer.state.log_history),
        "global_step": trainer.state.global_step,
        "base_unchanged": base_unchanged,
        "lora_tensors_changed": lora_changed,
        "lora_tensors": len(lora_before),
        "trainable": sum(p.numel() for p in trained.parameters() if p.requires_grad),
        "saved_files": sorted(p.name for p in folder.iterdir()),
        "reload_max_abs_diff": float((expected - actual).abs().max()),
    }


def run_sft(args: argparse.Namespace) -> dict[str, Any]:
    """trl's SFTTrainer on a text dataset (datasets.Dataset, as trl takes it)."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tokenizer = build_tokenizer(args.workdir)
    model = tiny_gpt2(tokenizer)
    dataset = Dataset.from_dict({"text": corpus(96, seed=3)})
    config = SFTConfig(
        output_dir=str(args.workdir / "sft"),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=2,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        seed=42,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        max_length=BLOCK,
        dataset_num_proc=None,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(args.workdir / "sft-final"))
    from transformers import GPT2LMHeadModel

    reloaded = GPT2LMHeadModel.from_pretrained(str(args.workdir / "sft-final"))
    trained = trainer.accelerator.unwrap_model(trainer.model)
    same = all(
        torch.equal(a, b) for a, b in zip(trained.state_dict().values(), reloaded.state_dict().values())
    )
    return {
        "losses": step_losses(trainer.state.log_history),
        "global_step": trainer.state.global_step,
        "reloaded_equal": same,
    }


def run_device_map(args: argparse.Namespace) -> dict[str, Any]:
    """``from_pretrained(device_map="auto", max_memory={"cpu": "300KB"})``: what does not fit in the budget
    spills to disk, and the model computes the same logits as when it is loaded whole."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer(args.workdir)
    # 8 blocks and a 1024-row embedding (tied to lm_head): 546 KB, so 300 KB of RAM holds only part of it
    model = tiny_gpt2(tokenizer, n_layer=8, vocab_size=1024)
    saved = args.workdir / "saved"
    model.save_pretrained(saved)
    offload = args.workdir / "offload"
    max_memory = {"cpu": "300KB"}
    spilled = AutoModelForCausalLM.from_pretrained(
        saved, device_map="auto", max_memory=max_memory, offload_folder=str(offload)
    )
    sample = torch.tensor([tokenizer(corpus(1, seed=5)[0])["input_ids"][:BLOCK]])
    with torch.no_grad():
        expected = model.eval()(sample).logits
        actual = spilled(sample).logits
    return {
        "device_map": {key: str(value) for key, value in spilled.hf_device_map.items()},
        # weights mapped to disk are read from the checkpoint (or offload_folder) when their module runs
        "parameters_in_ram": sum(p.device.type == "cpu" for p in spilled.parameters()),
        "parameters_not_in_ram": sum(p.device.type == "meta" for p in spilled.parameters()),
        "max_abs_diff": float((expected - actual).abs().max()),
        "max_memory_after": {key: value for key, value in max_memory.items()},
    }


SCENARIOS = {"trainer": run_trainer, "lora": run_lora, "sft": run_sft, "device_map": run_device_map}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--save-steps", type=int, default=15)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument(
        "--deepspeed", default=None, help="a DeepSpeed config file (TrainingArguments(deepspeed=))"
    )
    parser.add_argument("--fsdp", action="store_true", help="TrainingArguments(fsdp=...) with FSDP2")
    args = parser.parse_args(argv)
    args.workdir = args.workdir or args.out.parent
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(SCENARIOS[args.scenario](args), indent=1, sort_keys=True)
    if int(os.environ.get("RANK", "0")) == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return json.loads(text)  # as a reader of the file sees it (steps as strings)


if __name__ == "__main__":
    main()
