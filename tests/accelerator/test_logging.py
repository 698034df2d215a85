"""get_logger (main process only, in order), DRIVETRAIN_LOG_LEVEL, and the main-process tqdm."""

from __future__ import annotations

import io
import logging
import re
import textwrap

import pytest

from drivetrain.logging import get_logger
from drivetrain.progress import progress, tqdm


@pytest.fixture
def captured():
    """A handler on a fresh logger, and the logger's name."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(funcName)s %(message)s"))
    base = logging.getLogger("drivetrain.test.logging")
    base.addHandler(handler)
    root_level = logging.getLogger().level
    yield base.name, stream
    base.removeHandler(handler)
    base.setLevel(logging.NOTSET)
    logging.getLogger().setLevel(root_level)


def test_levels_and_caller(captured, monkeypatch):
    name, stream = captured
    logger = get_logger(name, log_level="info")
    logger.debug("hidden")
    logger.info("shown %s", 1)
    logger.warning_once("twice?")
    logger.warning_once("twice?")
    assert stream.getvalue().splitlines() == [
        "INFO test_levels_and_caller shown 1",  # the record names the caller, not the adapter
        "WARNING test_levels_and_caller twice?",
    ]
    monkeypatch.setenv("DRIVETRAIN_LOG_LEVEL", "DEBUG")
    get_logger(name).debug("now shown")
    assert stream.getvalue().splitlines()[-1] == "DEBUG test_levels_and_caller now shown"
    monkeypatch.setenv("DRIVETRAIN_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="unknown log level 'LOUD' from DRIVETRAIN_LOG_LEVEL"):
        get_logger(name)


def test_rank_without_process_state(captured, monkeypatch):
    """Before any Accelerator exists, the launcher's RANK decides (no process group is started)."""
    name, stream = captured
    logger = get_logger(name, log_level="INFO")
    monkeypatch.setenv("RANK", "1")
    logger.info("main only")
    logger.info("everyone", main_process_only=False)
    assert stream.getvalue().splitlines() == ["INFO test_rank_without_process_state everyone"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="in_order=True needs the process state"):
        logger.info("ordered", main_process_only=False, in_order=True)


def test_tqdm_main_process_only(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert tqdm(range(3)).disable
    assert not tqdm(range(3), main_process_only=False, file=io.StringIO()).disable
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not tqdm(range(3), file=io.StringIO()).disable
    assert tqdm(range(3), disable=True).disable
    with pytest.raises(ValueError, match="main_process_only=... by keyword"):
        tqdm(True, range(3))


def test_progress_is_off_without_a_terminal(monkeypatch):
    """pytest captures stderr (not a terminal): the bar is silent but usable."""
    with progress(10, "saving") as bar:
        bar.update(5)
    assert type(bar).__name__ == "_Silent"


SCRIPT = textwrap.dedent(
    """
    import logging, sys, time
    from drivetrain import Accelerator
    from drivetrain.logging import get_logger
    from drivetrain.progress import tqdm

    logging.basicConfig(format="%(message)s", stream=sys.stdout, level=logging.INFO)
    logger = get_logger("script")
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    logger.info(f"once from {rank}")
    logger.info(f"each from {rank}", main_process_only=False)
    accelerator.wait_for_everyone()
    if rank == 0:
        time.sleep(1.0)  # without in_order, rank 1 would print first
    for line in range(2):
        logger.info(f"ordered {line} from {rank}", main_process_only=False, in_order=True)
    for _ in tqdm(range(3), desc=f"bar of rank {rank}"):
        pass
    accelerator.end_training()
    """
)


@pytest.mark.multiprocess
def test_two_processes(tmp_path):
    from drivetrain.testing import launch_script

    script = tmp_path / "log.py"
    script.write_text(SCRIPT)
    result = launch_script(str(script), num_processes=2, env={"TMPDIR": str(tmp_path)})
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("once")] == ["once from 0"]
    assert sorted(line for line in lines if line.startswith("each")) == ["each from 0", "each from 1"]
    assert [line for line in lines if line.startswith("ordered")] == [
        "ordered 0 from 0",
        "ordered 0 from 1",
        "ordered 1 from 0",
        "ordered 1 from 1",
    ]
    assert "bar of rank 0" in result.stderr
    assert not re.search("bar of rank 1", result.stderr)
