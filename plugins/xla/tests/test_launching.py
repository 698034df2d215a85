"""The xla plugin without torch_xla (the project's own env): launch flags and config keys, `drivetrain
tpu-config`, what is chosen when, and the errors that say what is missing."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
import torch
from drivetrain_xla import config, device, launching, plugin, runtime

from drivetrain import reset_state


def _tpu_config(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    launching.register_tpu_config(parser)
    return parser.parse_args(list(argv))


def test_tpu_config_builds_the_gcloud_command_for_every_worker(tmp_path):
    commands = tmp_path / "setup.sh"
    commands.write_text("echo one\n\necho two\n")
    args = _tpu_config(
        "--tpu_name",
        "pod",
        "--tpu_zone",
        "us-central2-b",
        "--command_file",
        str(commands),
        "--install_drivetrain",
    )
    command = launching.tpu_config_command(args)
    assert command[:8] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", "--zone", "us-central2-b"]
    assert command[8:] == [
        "--command",
        "cd /usr/share; pip install -U drivetrain drivetrain-xla; echo one; echo two",
        "--worker",
        "all",
    ]
    alpha = launching.tpu_config_command(
        _tpu_config("--tpu_name", "p", "--tpu_zone", "z", "--command", "ls", "--use_alpha")
    )
    assert alpha[:2] == ["gcloud", "alpha"]


def test_tpu_config_reads_name_zone_and_commands_from_the_config_file(tmp_path, monkeypatch):
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        "distributed_type: XLA\ntpu_name: mypod\ntpu_zone: europe-west4-a\ncommands:\n  - echo hi\n"
    )
    monkeypatch.delenv("DRIVETRAIN_CONFIG_FILE", raising=False)
    command = launching.tpu_config_command(_tpu_config("--config_file", str(config_file)))
    assert command[5:8] == ["mypod", "--zone", "europe-west4-a"]
    assert command[8:10] == ["--command", "cd /usr/share; echo hi"]


def test_drivetrain_tpu_config_debug_prints_the_command_and_errors_name_what_is_missing(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("DRIVETRAIN_CONFIG_FILE", None)
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "drivetrain.commands.main",
            "tpu-config",
            "--tpu_name",
            "p",
            "--tpu_zone",
            "z",
            "--command",
            "echo hi",
            "--debug",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    # Accelerate's --debug line, word for word
    assert (
        shown.stdout.strip()
        == "Running gcloud compute tpus tpu-vm ssh p --zone z --command cd /usr/share; echo hi --worker all"
    )
    missing = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "tpu-config", "--command", "ls"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert missing.returncode == 2
    assert "tpu-config needs --tpu_name and --tpu_zone" in missing.stderr


def test_pod_launch_runs_drivetrain_launch_on_every_worker(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(
        tpu_name="pod",
        tpu_zone="zone",
        vm=["w0", "w1"],
        env=["A=1 2"],
        main_training_function="main",
        downcast_bf16=True,
        tpu_use_sudo=True,
        mixed_precision="bf16",
    )
    command = launching.pod_command(args, {"tpu_env": ["B=3"]}, ["train.py", "--lr", "0.1"])
    assert command[5:8] == ["pod", "--zone=zone", "--worker=w0,w1"]
    assert command[8] == (
        f"--command=cd {tmp_path}; export A='1 2'; export B=3; sudo -E drivetrain launch --tpu "
        "--main_training_function main --downcast_bf16 --mixed_precision bf16 train.py --lr 0.1"
    )
    with pytest.raises(Exception, match="needs the pod's name and zone"):
        launching.pod_command(argparse.Namespace(), {}, ["train.py"])


def test_bf16_launch_variables():
    assert launching.precision_environment("bf16", False) == {"XLA_USE_BF16": "1"}
    assert launching.precision_environment("bf16", True) == {"XLA_DOWNCAST_BF16": "1"}
    assert launching.precision_environment("no", True) == {}


def test_config_keys_are_checked_with_the_key_named(tmp_path, monkeypatch):
    from drivetrain.plugin_api import ConfigurationError
    from drivetrain.plugin_api.settings import plugin_options

    launching.file_options()  # loads the plugin, which claims its keys
    config_file = tmp_path / "config.yaml"
    config_file.write_text("distributed_type: XLA\ntpu_use_sudo: maybe\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(config_file))
    with pytest.raises(
        ConfigurationError, match="tpu_use_sudo: 'maybe' is not valid \\(expected true or false\\)"
    ):
        plugin_options("xla")
    config_file = tmp_path / "other.yaml"
    config_file.write_text("distributed_type: XLA\nmain_training_function: train\ndowncast_bf16: true\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(config_file))
    assert plugin_options("xla") == {"main_training_function": "train", "downcast_bf16": True}
    # what Accelerate writes into every config file states no choice
    config_file = tmp_path / "accelerate.yaml"
    config_file.write_text(
        "distributed_type: MULTI_CPU\nmain_training_function: main\ndowncast_bf16: 'no'\ntpu_env: []\n"
        "tpu_use_cluster: false\ntpu_use_sudo: false\n"
    )
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(config_file))
    assert plugin_options("xla") == {}


def test_launch_help_lists_the_tpu_flags(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    shown = subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", "launch", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    for flag in (
        "--tpu ",
        "--tpu_use_cluster",
        "--tpu_use_sudo",
        "--vm",
        "--env",
        "--main_training_function",
        "--downcast_bf16",
        "--xla_spmd",
    ):
        assert flag in shown.stdout, flag


def test_xla_config_from_launch_settings(monkeypatch):
    from drivetrain.plugin_api import ConfigurationError

    assert config.resolve(config.XlaConfig(fsdp=True)).uses_spmd
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", '{"xla_spmd": true, "main_training_function": "main"}')
    assert config.resolve(None) == config.XlaConfig(spmd=True)
    reset_state()  # resolved once per run: a new environment needs a new run
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", '{"spmd": "sometimes"}')
    with pytest.raises(ConfigurationError, match="XlaConfig.spmd='sometimes' is not a boolean"):
        config.resolve(None)
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", '{"mesh": 2}')
    with pytest.raises(ConfigurationError, match="unknown xla setting\\(s\\) mesh"):
        config.resolve(None)
    with pytest.raises(ConfigurationError, match="takes XlaConfig objects as its configuration"):
        config.resolve(object())


def test_a_launcher_setting_conflicting_with_the_scripts_plugin_raises_naming_both(monkeypatch):
    from drivetrain.plugin_api import ConfigurationError

    # drivetrain launch --xla_spmd false (or a config file's backend_config) against the script's XlaConfig
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", '{"xla_fsdp": "no"}')
    assert config.resolve(config.XlaConfig(spmd=True)) == config.XlaConfig(spmd=True, fsdp=False)
    reset_state()
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", '{"xla_spmd": false}')
    with pytest.raises(ConfigurationError) as caught:
        config.resolve(config.XlaConfig(spmd=True))
    assert str(caught.value) == (
        "conflicting xla setting 'spmd': XlaConfig(spmd=True) in the script but False from environment "
        "DRIVETRAIN_BACKEND_CONFIG; remove one of them or make them agree"
    )


def test_weights_are_tied_again_by_name():
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(5, 3)
            self.head = torch.nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    model.head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())  # what .to(xla) leaves
    plugin.retie(model, [["embed.weight", "head.weight"]])
    assert model.head.weight is model.embed.weight


@pytest.mark.skipif(runtime.torch_xla_problem() is None, reason="torch_xla works here (the pinned env)")
def test_without_torch_xla_the_answers_are_truthful(monkeypatch):
    from drivetrain.plugin_api import ConfigurationError
    from drivetrain.utils import is_torch_xla_available

    assert is_torch_xla_available() is False
    assert is_torch_xla_available(check_is_tpu=True) is False
    monkeypatch.setattr(runtime, "_REQUESTED_AT_START", {"PJRT_DEVICE": "TPU"})
    with pytest.warns(UserWarning, match="PJRT_DEVICE=TPU asks for an XLA device, but torch_xla"):
        assert device.detect_device(cpu=False) is None
    with pytest.raises(ConfigurationError, match="backend 'xla' cannot run here: torch_xla"):
        plugin.detect_device(cpu=False)


def test_no_xla_device_unless_asked(monkeypatch):
    monkeypatch.setattr(runtime, "_REQUESTED_AT_START", {name: None for name in runtime.REQUEST_VARIABLES})
    assert device.detect_device(cpu=False) is None
    monkeypatch.setattr(runtime, "_REQUESTED_AT_START", {"PJRT_DEVICE": "CPU"})
    assert device.detect_device(cpu=True) is None


def test_accelerates_tpu_command_parser_and_launcher(capsys):
    from drivetrain.commands.tpu import tpu_command_launcher, tpu_command_parser

    args = tpu_command_parser().parse_args(
        ["--command", "ls", "--tpu_zone", "us-central1-a", "--tpu_name", "test-tpu", "--debug"]
    )
    tpu_command_launcher(args)
    assert capsys.readouterr().out.strip() == (
        "Running gcloud compute tpus tpu-vm ssh test-tpu --zone us-central1-a --command cd /usr/share; ls --worker all"
    )
