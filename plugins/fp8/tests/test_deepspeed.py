"""fp8 (torchao) then DeepSpeed: a real one-process engine (gloo group of one) built on the converted model."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from drivetrain import Accelerator
from drivetrain_fp8.ao import converted_layer_names

pytest.importorskip("deepspeed", reason="needs the deepspeed package")


@pytest.fixture
def one_process(monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    extensions = os.path.join(os.path.expanduser("~"), ".cache", "drivetrain", "torch_extensions")
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "DS_ACCELERATOR": "cpu",
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", extensions),
    }.items():
        monkeypatch.setenv(name, value)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_fp8_then_deepspeed_zero2_trains(one_process):
    from drivetrain import DeepSpeedPlugin

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 4),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    accelerator = Accelerator(
        mixed_precision="fp8",
        deepspeed_plugin=DeepSpeedPlugin(
            hf_ds_config={
                "train_micro_batch_size_per_gpu": 32,
                "zero_optimization": {"stage": 2},
                "bf16": {"enabled": "auto"},
            }
        ),
    )
    engine, optimizer = accelerator.prepare(model, optimizer)
    # converted before the engine was built; the engine keeps the rest in bf16
    assert converted_layer_names(engine.module) == ["2"]
    assert engine.bfloat16_enabled()
    assert engine.module[2].weight.dtype == torch.bfloat16

    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(32, 16, generator=generator)
    targets = inputs[:, :4].sin()
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.mse_loss(engine(inputs).float(), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
