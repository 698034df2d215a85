"""Data sharding with real ranks (torch's elastic launcher, gloo on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from drivetrain.testing import launch_script

SCRIPTS = Path(__file__).parents[1] / "scripts"


@pytest.fixture
def launch_env(tmp_path):
    return {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}


@pytest.mark.multiprocess
def test_every_sharding_mode_covers_the_data_exactly_once_on_two_ranks(launch_env):
    result = launch_script(str(SCRIPTS / "data_sharding.py"), num_processes=2, env=launch_env)
    assert result.stdout.count("data_sharding OK") == 2


@pytest.mark.multiprocess
@pytest.mark.parametrize("world,examples", [(2, 40), (3, 25)])
def test_gather_for_metrics_returns_exactly_the_data_property(world, examples, launch_env):
    result = launch_script(
        str(SCRIPTS / "data_gather_property.py"), num_processes=world, args=[str(examples)], env=launch_env
    )
    assert result.stdout.count("data_gather_property OK") == world


@pytest.mark.multiprocess
def test_gather_for_metrics_is_exact_however_the_loader_is_consumed(launch_env):
    from drivetrain.testing import assert_checks_passed

    result = launch_script(str(SCRIPTS / "data_gather_consumption.py"), num_processes=2, env=launch_env)
    assert_checks_passed(
        result,
        [
            "next_iter",
            "next_iter_again",
            "loop_broken_early",
            "interleaved_first",
            "interleaved_second",
            "skip_first_batches",
            "full_loop_after_all_that",
        ],
    )
