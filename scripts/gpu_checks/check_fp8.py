"""Check 6: mixed_precision="fp8" with torchao (AORecipeKwargs) on the GPU: the prepared model holds torchao
Float8Linear modules, it trains, and its final loss is within 5% of the same run in bf16."""

from __future__ import annotations

import sys

import torch
from common import Skip, device_or_exit, prepared_task, run_checks, train_autocast

from drivetrain import Accelerator
from drivetrain.state import reset_state

EPOCHS = 4


def train(precision: str):
    from drivetrain.utils import AORecipeKwargs

    reset_state()
    handlers = [AORecipeKwargs()] if precision == "fp8" else []
    accelerator = Accelerator(mixed_precision=precision, kwargs_handlers=handlers)
    model, optimizer, loader = prepared_task(
        accelerator, torch.optim.AdamW, lr=3e-3, hidden=128, rows=1024, batch=32
    )
    float8 = [name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"]
    losses = train_autocast(accelerator, model, optimizer, loader, EPOCHS)
    accelerator.end_training()
    return losses, float8


def main() -> int:
    device = device_or_exit("fp8_torchao")
    if device.type == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        print("RESULT fp8_torchao SKIP 0 GPU compute capability < 8.9 (no float8 matmul)", flush=True)
        return 0

    def trains():
        try:
            import torchao
        except ImportError as error:
            raise Skip(f"torchao not importable: {error}") from error
        fp8, float8 = train("fp8")
        bf16, _ = train("bf16")
        tail = 8
        last_fp8, last_bf16 = sum(fp8[-tail:]) / tail, sum(bf16[-tail:]) / tail
        gap = abs(last_fp8 - last_bf16) / last_bf16
        ok = bool(float8) and gap < 0.05 and last_fp8 < 0.5 * fp8[0]
        return (
            ok,
            gap,
            (
                f"relative final-loss gap fp8 vs bf16 (pass < 0.05; fp8 {fp8[0]:.4f} -> {last_fp8:.4f}, bf16 "
                f"{last_bf16:.4f}); Float8Linear modules: {float8 or 'none'}; torchao {torchao.__version__}, {device}"
            ),
        )

    return run_checks([("fp8_torchao_trains_close_to_bf16", trains)])


if __name__ == "__main__":
    sys.exit(main())
