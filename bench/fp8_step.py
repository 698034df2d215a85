"""Training step of a model prepared with ``mixed_precision="fp8"`` (torchao) against the same conversion
written by hand with torchao.

    python bench/fp8_step.py [--steps 150] [--repeats 11] [--hidden 256] [--batch 64] [--device cpu]

Both sides: the same MLP (``--hidden`` wide, 4 Linear layers; the two inner ones converted to
``Float8Linear``, first and last kept in high precision, ``pad_inner_dim=True``), forward under bf16 autocast
with fp32 outputs, AdamW. Hand-written: ``convert_to_float8_training`` with the same module filter and
``torch.autocast`` around the forward. Reports the median over interleaved repeats (alternating which side runs first) of the per-step time (CPU
process time on CPU, wall time with synchronisation on CUDA) and the ratio prepared / hand-written. Target
(issue 19): <= 1.05x. Also reports bf16 autocast without conversion for scale (on CPU float8 matmuls are
emulated through ``torch._scaled_mm``'s reference kernel, so fp8 is slower than bf16 there; the speed-up
exists only on GPUs with float8 tensor cores and compute-bound layers).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch

logging.getLogger("torchao").setLevel(logging.ERROR)
torch.set_num_threads(1)


def build(hidden: int, batch: int, device: str, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, 16),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(batch, 64, generator=generator).to(device),
            torch.randn(batch, 16, generator=generator).to(device),
        )
        for _ in range(16)
    ]
    return model, optimizer, batches


def clock(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def run_by_hand(steps: int, hidden: int, batch: int, device: str, convert: bool = True) -> float:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model, optimizer, batches = build(hidden, batch, device)
    if convert:
        convert_to_float8_training(
            model,
            module_filter_fn=lambda module, name: name not in ("0", "6"),
            config=Float8LinearConfig(pad_inner_dim=True),
        )
    start = clock(device)
    for step in range(steps):
        inputs, targets = batches[step % len(batches)]
        with torch.autocast(device, dtype=torch.bfloat16):
            outputs = model(inputs)
        loss = torch.nn.functional.mse_loss(outputs.float(), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return (clock(device) - start) / steps


def run_prepared(steps: int, hidden: int, batch: int, device: str) -> float:
    from drivetrain import Accelerator

    accelerator = Accelerator(mixed_precision="fp8", cpu=device == "cpu")
    model, optimizer, batches = build(hidden, batch, device)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert [type(model[i]).__name__ for i in (0, 2, 4, 6)] == [
        "Linear",
        "Float8Linear",
        "Float8Linear",
        "Linear",
    ]
    start = clock(device)
    for step in range(steps):
        inputs, targets = batches[step % len(batches)]
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return (clock(device) - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    shape = (args.hidden, args.batch, args.device)

    run_by_hand(20, *shape), run_prepared(20, *shape), run_by_hand(20, *shape, convert=False)  # warm up
    by_hand, prepared, bf16 = [], [], []
    for repeat in range(args.repeats):
        # alternate which side runs first, so drift in a shared machine's speed does not favour one side
        if repeat % 2:
            prepared.append(run_prepared(args.steps, *shape))
            by_hand.append(run_by_hand(args.steps, *shape))
        else:
            by_hand.append(run_by_hand(args.steps, *shape))
            prepared.append(run_prepared(args.steps, *shape))
        bf16.append(run_by_hand(args.steps, *shape, convert=False))
    hand_ms, prepared_ms, bf16_ms = (statistics.median(times) * 1e3 for times in (by_hand, prepared, bf16))
    ratios = [ours / theirs for ours, theirs in zip(prepared, by_hand)]
    print(
        f"device {args.device}, hidden {args.hidden}, batch {args.batch}, {args.steps} steps x {args.repeats}"
    )
    print(f"torchao by hand : {hand_ms:.3f} ms/step")
    print(f"prepared fp8    : {prepared_ms:.3f} ms/step")
    print(
        f"ratio prepared / by hand: {statistics.median(ratios):.3f} (median of per-repeat ratios; target <= 1.05)"
    )
    print(f"bf16 autocast, not converted: {bf16_ms:.3f} ms/step (fp8 / bf16 = {hand_ms / bf16_ms:.2f})")


if __name__ == "__main__":
    main()
