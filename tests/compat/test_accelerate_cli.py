"""What users of Accelerate's commands observe: estimate-memory's errors, the env report, the Hub check (issue
17's findings of the peer suite; each test asserts what such a script observes)."""

from __future__ import annotations

import pytest
import torch


def test_estimating_an_unknown_model_is_an_os_error_and_a_one_line_cli_error(capsys):
    from drivetrain.commands.estimate import estimate_command, estimate_command_parser
    from drivetrain.commands.main import main as cli_main

    with pytest.raises(OSError, match="'somebrokenname' is not a local folder"):
        estimate_command(estimate_command_parser().parse_args(["somebrokenname"]))
    assert cli_main(["estimate-memory", "somebrokenname"]) == 2
    assert "'somebrokenname' is not a local folder" in capsys.readouterr().err


def test_env_command_returns_the_report_and_says_when_the_console_command_is_not_on_path(monkeypatch, capsys):
    # Scripts call Accelerate's env_command for a dict of the report (its keys), e.g. to check the install.
    import shutil

    from drivetrain.commands import env

    args = env.env_command_parser().parse_args([])
    info = env.env_command(args)
    assert info["`accelerate` bash location"] == shutil.which("drivetrain")
    assert info["PyTorch version"] == torch.__version__
    monkeypatch.setattr(env, "which", lambda name: None)
    info = env.env_command(args)
    assert info["`accelerate` bash location"] == "Not found"
    assert "- `drivetrain` bash location: Not found" in capsys.readouterr().out


def test_verify_on_hub_answers_gated_or_repo_as_accelerate_does(monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    from drivetrain.commands.estimate import verify_on_hub

    def raising(kind):
        error = kind.__new__(kind)  # the Hub's errors want an HTTP response; the message is all that matters
        OSError.__init__(error, "from the Hub")

        def model_info(repo, token=None):
            raise error

        return model_info

    monkeypatch.setattr(huggingface_hub, "model_info", raising(GatedRepoError))
    assert verify_on_hub("owner/gated") == "gated"
    monkeypatch.setattr(huggingface_hub, "model_info", raising(RepositoryNotFoundError))
    assert verify_on_hub("owner/missing") == "repo"
    monkeypatch.setattr(huggingface_hub, "model_info", raising(ConnectionError))  # offline or unreachable
    assert verify_on_hub("owner/any") == "gated"
    seen = []
    monkeypatch.setattr(
        huggingface_hub, "model_info", lambda repo, token=None: seen.append((repo, token)) or "info"
    )
    assert verify_on_hub("owner/model", token="t") == "info" and seen == [("owner/model", "t")]


def test_estimate_memory_of_a_model_that_is_not_available_offline_is_an_os_error():
    # Accelerate raises OSError (EnvironmentError) for a gated or missing repository; scripts catch that.
    from drivetrain.commands.estimate import estimate_command, estimate_command_parser

    args = estimate_command_parser().parse_args(["no-such-owner/no-such-model"])
    with pytest.raises(OSError, match="no-such-owner/no-such-model"):
        estimate_command(args)


def test_the_launch_path_serves_accelerates_entry_points_and_patches_of_the_command_reach_them(monkeypatch):
    # Accelerate's accelerate.commands.launch names live in drivetrain.compat.accelerate_commands.launch; the
    # path serves them, and they call the command through it, so a patch there reaches them.
    from drivetrain.commands import launch
    from drivetrain.compat.accelerate_commands import launch as entry_points
    from peer import names as reference

    for name in reference.reference_names()["accelerate.commands.launch"]:
        assert hasattr(launch, name), name
        assert name in dir(launch), name
    assert launch.launch_command is entry_points.launch_command
    assert launch.simple_launcher is launch.multi_gpu_launcher is entry_points.launch_command
    assert launch.logger.logger.name == "drivetrain.commands.launch"
    assert launch.options_to_group["use_fsdp"] == "FSDP Arguments"
    assert launch.clean_option("--num-processes") == "num_processes" and launch.clean_option("-m") is None
    assert launch.FORMAT == "%(asctime)s - %(levelname)s - %(name)s - %(message)s"

    ran = []
    monkeypatch.setattr(launch, "run", lambda args: ran.append(args.training_script) or 0)
    launch.launch_command(launch.launch_command_parser().parse_args(["--cpu", "train.py"]))
    assert ran == ["train.py"]
