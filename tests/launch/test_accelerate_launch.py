"""What scripts and tools written for Accelerate observe of its launchers: notebook_launcher, the launch entry
points' environments, SageMaker's hyperparameters and launch's help (issue 17's findings of the peer suite;
each test asserts what such a script observes)."""

from __future__ import annotations

import sys
import types

import pytest


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _even_ranks_fail():
    from drivetrain import PartialState

    if PartialState().process_index % 2 == 0:
        raise RuntimeError("even rank refuses")


@pytest.mark.multiprocess
def test_notebook_launcher_failure_is_torchs_child_failed_error_too():
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from drivetrain import notebook_launcher
    from drivetrain.errors import DrivetrainError

    with pytest.raises(ChildFailedError, match="even rank refuses") as caught:
        notebook_launcher(_even_ranks_fail, (), num_processes=2, monitor_interval=0.05, use_port=_free_port())
    assert isinstance(caught.value, DrivetrainError)
    assert str(caught.value).startswith("process of rank 0 failed")


def test_notebook_launcher_refuses_to_fork_after_bitsandbytes_was_imported(monkeypatch):
    """As Accelerate: bitsandbytes may set up the device on import, so forking after it is refused."""
    from drivetrain import notebook_launcher

    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    started = []
    with pytest.raises(RuntimeError, match=r"\(bitsandbytes\)\. Please keep these imports inside"):
        notebook_launcher(started.append, (1,), num_processes=2, use_port=_free_port())
    assert started == []


def test_prepare_multi_gpu_env_takes_a_partial_namespace_and_picks_a_free_port():
    import argparse

    from drivetrain.commands.launch import prepare_multi_gpu_env

    args = argparse.Namespace(
        num_processes=2, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0
    )
    environment = prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"
    assert environment["PATH"]  # the launcher's environment is the current one plus its variables


def test_sagemaker_hyperparameters_are_typed_and_flags_without_values_refused():
    from drivetrain.compat.accelerate_api.launch_helpers import _convert_nargs_to_dict

    args = [
        "--model_name_or_path",
        "bert",
        "--do_train",
        "False",
        "--epochs",
        "3",
        "--lr",
        "5e-5",
        "--steps",
        "50.5",
    ]
    assert _convert_nargs_to_dict(args) == {
        "model_name_or_path": "bert",
        "do_train": False,
        "epochs": 3,
        "lr": 5e-5,
        "steps": 50.5,
    }
    assert type(_convert_nargs_to_dict(args)["epochs"]) is int
    with pytest.raises(ValueError, match="'--do_test' has no value"):
        _convert_nargs_to_dict(["--do_test", "--epochs", "3"])
    with pytest.raises(ValueError, match="'--do_predict' has no value"):
        _convert_nargs_to_dict(["--epochs", "3", "--do_predict"])


def test_prepare_multi_gpu_env_ignores_the_defaults_of_backends_the_namespace_does_not_select():
    import argparse

    from drivetrain.commands.launch import prepare_multi_gpu_env

    # what Accelerate's launcher hands over: every backend's options at Accelerate's defaults
    args = argparse.Namespace(
        num_processes=1, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0, machine_rank=0,
        use_fsdp=False, fsdp_offload_params=False, fsdp_min_num_params=0, fsdp_use_orig_params=False,
        use_megatron_lm=False, megatron_lm_tp_degree=1, megatron_lm_pp_degree=1,
        megatron_lm_gradient_clipping=1.0, use_tp=False, tp_size=1, use_parallelism_config=False,
    )  # fmt: skip
    prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"


def test_launch_help_says_once_that_flags_take_hyphens_or_underscores_and_both_parse_alike():
    from drivetrain.commands.launch import launch_command_parser

    parser = launch_command_parser()
    help_text = parser.format_help()
    assert help_text.count("--num-processes") == 1 and "--num_processes=2" in help_text
    hyphen = parser.parse_args(["--num-processes", "3", "--main-process-port", "29600", "train.py"])
    underscore = parser.parse_args(["--num_processes", "3", "--main_process_port", "29600", "train.py"])
    assert (
        (hyphen.num_processes, hyphen.main_process_port)
        == (underscore.num_processes, underscore.main_process_port)
        == (3, 29600)
    )
