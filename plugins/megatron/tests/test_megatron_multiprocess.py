"""The megatron backend in real processes (gloo on loopback): tp=2 on 2 processes and tp=2 x dp=2 on 4 train a
model of megatron-core Column/RowParallelLinear layers to the same weights as the dense model trained by the
``local`` backend (tolerance: rtol=1e-5, atol=1e-6; float32 sums differ only in order), resume exactly from
save_state, and refuse a checkpoint saved with other degrees."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from drivetrain.testing import assert_checks_passed, launch_script

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import megatron_checks as checks  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6


def dense_with_local(
    initial: dict[str, torch.Tensor], batch_size: int
) -> tuple[dict[str, torch.Tensor], list]:
    """The same model as dense torch layers, trained by the reference backend on the whole batch."""
    from drivetrain import Accelerator, reset_state

    reset_state()
    accelerator = Accelerator(backend="local", cpu=True)
    model = torch.nn.ModuleDict(
        {"up": torch.nn.Linear(checks.HIDDEN, checks.FFN), "down": torch.nn.Linear(checks.FFN, checks.HIDDEN)}
    )
    model.load_state_dict(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(checks.dataset(), batch_size=batch_size)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _, (x, y) in zip(range(checks.STEPS), loader):
        out = model["down"](torch.nn.functional.gelu(model["up"](x)))
        loss = torch.nn.functional.mse_loss(out, y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), checks.CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    reset_state()
    return {name: value.detach() for name, value in model.state_dict().items()}, losses


def assert_matches_dense(result_file: Path, batch_size: int) -> None:
    result = torch.load(result_file)
    dense, losses = dense_with_local(result["initial"], batch_size)
    for name, value in dense.items():
        torch.testing.assert_close(result["final"][name], value, rtol=RTOL, atol=ATOL, msg=name)
    assert result["losses"] == pytest.approx(losses, rel=RTOL, abs=ATOL)
    assert not torch.equal(result["final"]["up.weight"], result["initial"]["up.weight"])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_tensor_and_data_parallel_match_dense_local(tmp_path):
    env = {
        "TMPDIR": str(tmp_path),
        "MEGATRON_OUT": str(tmp_path),
        "MEGATRON_TP": "2",
        "PYTHONWARNINGS": "ignore",
    }
    saved = tmp_path / "tp2_checkpoint"
    common = ["distributed_type", "state_plugin_is_script_object", "groups", "global_batch_size"]
    common += ["batches_per_share", "tp_peers_same_batch", "dp_shares_differ", "gather_for_metrics_dp_once"]
    common += ["reduce_over_all_processes", "scheduler_steps_per_share"]

    two = launch_script(str(SCRIPTS / "megatron_checks.py"), 2, env={**env, "MEGATRON_SAVE": str(saved)})
    assert_checks_passed(two, [*common, "resume_exact", "checkpoint_per_tp_rank"])
    assert_matches_dense(tmp_path / "train_2.pt", checks.BATCH)

    four = launch_script(str(SCRIPTS / "megatron_checks.py"), 4, env={**env, "MEGATRON_FOREIGN": str(saved)})
    assert_checks_passed(four, [*common, "other_degrees_refused"])
    assert_matches_dense(tmp_path / "train_4.pt", 2 * checks.BATCH)
