"""plugin_api.join_process_group / wrap_data_parallel / release_at_shutdown / shutdown_process_group: a
backend's process group from the launcher's environment, left so that every process exits 0
(docs/plugins/tutorial.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from drivetrain.plugin_api import DistributedType, join_process_group
from drivetrain.testing import launch_script

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "process_group_shutdown.py")
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _checks(stdout: str) -> set[str]:
    # The ranks share the launcher's stdout: their lines can interleave, so match the reports, not lines.
    return {f"{name} rank={rank}" for name, rank in re.findall(r"CHECK (\w+) ok rank=(\d+)", stdout)}


@pytest.mark.multiprocess
@pytest.mark.parametrize("ending", ["shutdown", "exit"])
def test_two_gloo_processes_release_their_ddp_model_and_exit_0(tmp_path, ending):
    result = launch_script(SCRIPT, 2, ["--ending", ending], env={"TMPDIR": str(tmp_path)}, timeout=180)
    names = ["environment", "nothing_to_wrap", "wrapped_once", "averaged", "released"]
    names += ["module"] if ending == "shutdown" else []
    assert _checks(result.stdout) == {f"{name} rank={rank}" for name in names for rank in (0, 1)}
    assert "terminate called" not in result.stderr and "shutdown at exit failed" not in result.stderr


@pytest.fixture
def one_process(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_one_process_joins_no_group(one_process):
    environment = join_process_group(torch.device("cpu"), {})
    assert environment.distributed_type == DistributedType.NO and environment.num_processes == 1
    assert not torch.distributed.is_initialized()


def test_one_process_alone_gets_a_group_of_one_that_shutdown_destroys(one_process):
    environment = join_process_group(torch.device("cpu"), {"timeout": 30}, alone=True)
    try:
        assert torch.distributed.get_world_size() == 1 and environment.torch_backend == "gloo"
        assert (environment.num_processes, environment.distributed_type) == (1, DistributedType.NO)
    finally:
        environment.shutdown()
    assert not torch.distributed.is_initialized()


def test_several_processes_without_a_rendezvous_address_name_the_variable(one_process, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        RuntimeError, match="environment variable MASTER_ADDR, which torchrun / drivetrain launch"
    ):
        join_process_group(torch.device("cpu"), {})
