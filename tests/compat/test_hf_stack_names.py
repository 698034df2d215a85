"""What the test suites of transformers, peft and trl reach in ``accelerate`` besides the libraries' own code,
found by running them against drivetrain (hfstack/, issue 28): each test asserts what Accelerate 1.15.0 answers
there."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import types

import pytest
import torch

from drivetrain import Accelerator, hookimpl
from drivetrain.contract.environment import DistributedEnvironment
from drivetrain.contract.info import PluginInfo
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.state import GradientState, PartialState
from drivetrain.utils import DataLoaderConfiguration, GradientAccumulationPlugin


def test_get_backend_names_the_device_its_count_and_a_memory_reader():
    # peft's tests/testing_utils.py: `torch_device, device_count, memory_allocated_func = get_backend()`
    from drivetrain.test_utils.testing import get_backend

    device, count, memory_allocated = get_backend()
    if torch.accelerator.is_available():
        assert device == torch.accelerator.current_accelerator().type
        assert count == torch.accelerator.device_count()
        assert memory_allocated() >= 0
    else:
        assert (device, count) == ("cpu", 1)
        assert memory_allocated() == 0


def test_run_command_returns_the_output_and_raises_with_it(tmp_path):
    from drivetrain.test_utils.testing import SubprocessCallException, run_command

    script = tmp_path / "talk.py"
    script.write_text("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(int(sys.argv[1]))\n")
    # Path arguments are accepted; stdout and stderr come back together
    assert run_command([sys.executable, script, "0"], return_stdout=True) == "out\nerr\n"
    assert run_command([sys.executable, script, "0"]) is None
    with pytest.raises(
        SubprocessCallException, match=r"talk\.py 3` failed with the following error:\n\nout\nerr"
    ):
        run_command([sys.executable, script, "3"])
    with pytest.raises(subprocess.CalledProcessError):  # the original error is chained
        try:
            run_command([sys.executable, script, "3"])
        except SubprocessCallException as error:
            raise error.__cause__ from None


def test_partial_state_hands_timeout_to_the_process_group_setup():
    # transformers' TrainingArguments builds PartialState(backend=..., timeout=timedelta(ddp_timeout));
    # Accelerate passes `timeout` on to torch.distributed.init_process_group.
    seen = []

    def setup_process_group(device, init_kwargs):
        seen.append(dict(init_kwargs))
        return DistributedEnvironment()

    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="backend"))
    plugin.setup_process_group = hookimpl(setup_process_group)
    get_plugin_registry().register("toy", plugin)
    timeout = datetime.timedelta(seconds=1800)
    PartialState(backend="toy", timeout=timeout)
    assert seen == [{"timeout": timeout}]


def test_partial_state_still_refuses_unknown_arguments():
    with pytest.raises(TypeError, match="unexpected arguments: bogus"):
        PartialState(bogus=1)


def test_gradient_state_keeps_only_the_plugin_settings_that_differ_from_the_defaults():
    # transformers' Trainer tests read `accelerator.gradient_state.plugin_kwargs` back: Accelerate keeps the
    # plugin's to_kwargs(), so a setting left at its default is absent.
    state = GradientState(GradientAccumulationPlugin(num_steps=1))
    assert state.plugin_kwargs == {"num_steps": 1}
    assert (state.num_steps, state.adjust_scheduler, state.sync_with_dataloader, state.sync_each_batch) == (
        1,
        False,  # absent: Accelerate's property default, although the plugin's own default is True
        True,
        False,
    )
    state = GradientState(
        GradientAccumulationPlugin(num_steps=4, sync_each_batch=True, adjust_scheduler=False)
    )
    assert state.plugin_kwargs == {"num_steps": 4, "adjust_scheduler": False, "sync_each_batch": True}
    assert Accelerator(gradient_accumulation_steps=2).gradient_state.plugin_kwargs == {"num_steps": 2}


@pytest.mark.parametrize("dispatch_batches", [None, True, False])
def test_accelerator_reads_back_the_data_loader_settings(dispatch_batches):
    # transformers' accelerator_config keys, read back from `trainer.accelerator`
    config = DataLoaderConfiguration(
        split_batches=True, dispatch_batches=dispatch_batches, even_batches=False, use_seedable_sampler=True
    )
    accelerator = Accelerator(dataloader_config=config)
    assert accelerator.split_batches is True
    assert accelerator.dispatch_batches is dispatch_batches
    assert accelerator.even_batches is False
    assert accelerator.use_seedable_sampler is True
    defaults = Accelerator()
    assert (defaults.dispatch_batches, defaults.use_seedable_sampler) == (None, False)


def test_reset_state_with_partial_state_forgets_the_process_state():
    # transformers' TrainingArguments calls AcceleratorState._reset_state(reset_partial_state=True) before it
    # builds its own PartialState; `use_configured_state` then needs one built beforehand.
    from drivetrain.state import AcceleratorState

    Accelerator()
    assert PartialState._shared_state
    AcceleratorState._reset_state(reset_partial_state=True)
    assert PartialState._shared_state == {} and AcceleratorState._shared_state == {}


def test_the_utilities_peft_imports_are_where_it_imports_them():
    from drivetrain.utils import patch_environment
    from drivetrain.utils.imports import is_bf16_available
    from drivetrain.utils.memory import clear_device_cache

    with patch_environment(hfstack_probe="1"):
        assert os.environ["HFSTACK_PROBE"] == "1"
    assert "HFSTACK_PROBE" not in os.environ
    assert isinstance(is_bf16_available(), bool)
    clear_device_cache(garbage_collection=True)
