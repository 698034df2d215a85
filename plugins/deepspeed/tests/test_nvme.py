"""NVMe offload (ZeRO-Infinity) to a temporary folder, with a real one-process ZeRO-3 engine.

DeepSpeed swaps through its ``async_io`` C++ op, which needs libaio's headers and library (Debian:
``apt-get install libaio-dev``) and compiles on first use (about 10 minutes on 2 busy cores; cached in
``TORCH_EXTENSIONS_DIR``). Without libaio the NVMe tests are skipped with that reason; the configuration
errors are tested everywhere.
"""

from __future__ import annotations

import os

import pytest
import torch
from drivetrain_deepspeed import DeepSpeedPlugin

from drivetrain import Accelerator
from drivetrain.errors import ConfigurationError


def _aio_available() -> bool:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return bool(AsyncIOBuilder().is_compatible(verbose=False))


needs_aio = pytest.mark.skipif(
    not _aio_available(),
    reason="DeepSpeed's async_io op cannot build here: libaio headers/library missing (apt-get install libaio-dev)",
)


def train(plugin: DeepSpeedPlugin, steps: int = 3, partitioned_init: bool = False) -> dict[str, torch.Tensor]:
    from drivetrain.utils import zero3_init

    torch.manual_seed(0)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    # DeepSpeed swaps only tensors of at least 1 MiB (its aio block size): the 1024x512 layers are.
    with zero3_init(accelerator, enabled=partitioned_init):
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 512),
            torch.nn.Tanh(),
            torch.nn.Linear(512, 1024),
            torch.nn.Tanh(),
            torch.nn.Linear(1024, 512),
            torch.nn.Tanh(),
            torch.nn.Linear(512, 1),
        )
    data = torch.utils.data.TensorDataset(torch.randn(4 * steps, 6), torch.randn(4 * steps, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    return model.full_state_dict()


@needs_aio
@pytest.mark.slow
@pytest.mark.parametrize(
    ("part", "partitioned_init"), [("optimizer", False), ("param", False), ("param", True)]
)
def test_nvme_offload_trains_like_cpu_offload(one_process, tmp_path, part, partitioned_init):
    """Optimizer states (or parameters, created plainly or already partitioned) swapped to files in a folder
    train bit for bit as when kept in CPU memory, and the swap files are really written there."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    on_cpu = train(DeepSpeedPlugin(zero_stage=3, **{f"offload_{part}_device": "cpu"}))
    on_nvme = train(
        DeepSpeedPlugin(
            zero_stage=3, **{f"offload_{part}_device": "nvme", f"offload_{part}_nvme_path": str(nvme)}
        ),
        partitioned_init=partitioned_init,
    )
    swapped = [path.relative_to(nvme) for path in nvme.rglob("*") if path.is_file()]
    assert swapped, f"nothing was swapped under {nvme}"
    # fp32 parameters are swapped as fp32: partitioned by zero3_init or by the backend before the engine
    # (DeepSpeed's own partitioning would store them as bf16 on this CPU and drift by 0.03).
    assert not any("bfloat16" in str(path) for path in swapped), swapped
    assert all(torch.equal(on_nvme[key], on_cpu[key]) for key in on_cpu)


def test_nvme_field_without_a_path_is_an_error():
    with pytest.raises(ConfigurationError, match="offload_optimizer_device='nvme' needs DeepSpeedPlugin"):
        DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="nvme")


def test_nvme_config_without_a_path_is_an_error(one_process):
    config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model = torch.nn.Linear(3, 1)
    loader = torch.utils.data.DataLoader(torch.randn(8, 3), batch_size=4)
    with pytest.raises(ConfigurationError, match="offload_param.device is 'nvme' but it has no .*nvme_path"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)


def test_nvme_optimizer_offload_below_stage_3_warns(one_process, tmp_path):
    plugin = DeepSpeedPlugin(
        zero_stage=2, offload_optimizer_device="nvme", offload_optimizer_nvme_path=str(tmp_path)
    )
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = torch.nn.Linear(3, 1)
    loader = torch.utils.data.DataLoader(torch.randn(8, 3), batch_size=4)
    with pytest.warns(UserWarning, match="swaps optimizer states to NVMe only at stage 3"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
