"""FullyShardedDataParallelPlugin: validation, Accelerate's names, and resolving it with the launcher's settings
and the config file (``plugin_api.resolve_backend_config``)."""

from __future__ import annotations

import json

import pytest
import torch
from drivetrain_fsdp.config import (
    AutoWrapPolicy,
    FullyShardedDataParallelPlugin,
    ShardingStrategy,
    StateDictType,
    enable_fsdp_ram_efficient_loading,
)
from drivetrain_fsdp.merge import merge_fsdp_weights
from drivetrain_fsdp.plugin import resolve_config
from drivetrain_fsdp.process_group import mesh_shape
from torch.distributed.fsdp import ShardingStrategy as TorchShardingStrategy

from drivetrain.errors import CheckpointError, ConfigurationError


def test_defaults_and_backend_name():
    plugin = FullyShardedDataParallelPlugin()
    assert FullyShardedDataParallelPlugin.backend_name == "fsdp"
    assert (
        plugin.sharding_strategy == ShardingStrategy.FULL_SHARD
        and plugin.effective_reshard_after_forward is True
    )
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert plugin.sync_module_states_enabled is False and plugin.fsdp_version == 2


@pytest.mark.parametrize(
    "value",
    [
        "SHARD_GRAD_OP",
        "shard_grad_op",
        "2",
        2,
        ShardingStrategy.SHARD_GRAD_OP,
        TorchShardingStrategy.SHARD_GRAD_OP,  # torch's enum, as Accelerate scripts pass it
    ],
)
def test_strategy_spellings(value):
    plugin = FullyShardedDataParallelPlugin(sharding_strategy=value)
    assert (
        plugin.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
        and plugin.effective_reshard_after_forward is False
    )


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"sharding_strategy": "ZERO3"}, ["sharding_strategy", "FULL_SHARD"]),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, ["state_dict_type", "SHARDED_STATE_DICT"]),
        ({"fsdp_version": 3}, ["fsdp_version", "1 (FullyShardedDataParallel)"]),
        ({"cpu_ram_efficient_loading": True, "sync_module_states": False}, ["sync_module_states=True"]),
        ({"sharding_strategy": "SHARD_GRAD_OP", "reshard_after_forward": True}, ["reshard_after_forward"]),
        ({"auto_wrap_policy": "SIZE_BASED_WRAP"}, ["min_num_params"]),
        ({"hybrid_shard_size": 2}, ["hybrid_shard_size", "HYBRID_SHARD"]),
        ({"mixed_precision_policy": {"param_dtype": "int8"}}, ["param_dtype", "bf16"]),
        ({"mixed_precision_policy": {"compute": "bf16"}}, ["unknown key", "compute"]),
        ({"activation_checkpointing": "maybe"}, ["activation_checkpointing"]),
        ({"ignored_modules": "("}, ["ignored_modules", "regular expression"]),
        ({"min_num_params": -1}, ["min_num_params", ">= 0"]),
    ],
)
def test_bad_values_name_the_field(fields, words):
    with pytest.raises(ConfigurationError) as raised:
        FullyShardedDataParallelPlugin(**fields)
    for word in words:
        assert word in str(raised.value)


def test_mixed_precision_policy_forms():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert FullyShardedDataParallelPlugin(
        mixed_precision_policy="bf16"
    ).mixed_precision_policy == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    policy = FullyShardedDataParallelPlugin(
        mixed_precision_policy={"param_dtype": "bf16", "reduce_dtype": "fp32"}
    )
    assert policy.mixed_precision_policy.reduce_dtype == torch.float32


def test_wrap_policy_resolution():
    model = torch.nn.Linear(2, 2)
    assert FullyShardedDataParallelPlugin().resolved_auto_wrap_policy(model) == AutoWrapPolicy.NO_WRAP
    assert FullyShardedDataParallelPlugin(
        transformer_cls_names_to_wrap="A, B"
    ).transformer_cls_names_to_wrap == ["A", "B"]
    assert (
        FullyShardedDataParallelPlugin(min_num_params=10).resolved_auto_wrap_policy(model)
        == AutoWrapPolicy.SIZE_BASED_WRAP
    )
    model._no_split_modules = ["Linear"]
    assert (
        FullyShardedDataParallelPlugin().resolved_auto_wrap_policy(model)
        == AutoWrapPolicy.TRANSFORMER_BASED_WRAP
    )


def test_mesh_shapes():
    def shape(world, local, **fields):
        return mesh_shape(FullyShardedDataParallelPlugin(**fields), world, local)

    assert shape(8, 4) == (8,)
    assert shape(8, 4, sharding_strategy="NO_SHARD") == (8, 1)
    assert shape(8, 4, sharding_strategy="HYBRID_SHARD") == (2, 4)
    assert shape(8, 4, sharding_strategy="HYBRID_SHARD_ZERO2", hybrid_shard_size=2) == (4, 2)
    with pytest.raises(ConfigurationError, match="hybrid_shard_size=3 must divide"):
        shape(8, 4, sharding_strategy="HYBRID_SHARD", hybrid_shard_size=3)


def test_from_launch_environment_with_accelerate_names(monkeypatch):
    monkeypatch.setenv(
        "DRIVETRAIN_BACKEND_CONFIG",
        json.dumps(
            {
                "fsdp_sharding_strategy": "HYBRID_SHARD",
                "fsdp_offload_params": "false",
                "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
                "fsdp_state_dict_type": "FULL_STATE_DICT",
                "fsdp_activation_checkpointing": "true",
                "fsdp_version": 2,
            }
        ),
    )
    plugin = resolve_config(None)
    assert plugin.sharding_strategy == ShardingStrategy.HYBRID_SHARD
    assert plugin.transformer_cls_names_to_wrap == ["BertLayer"] and plugin.activation_checkpointing is True
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT and plugin.offloads_params is False


def test_environment_errors_name_the_source(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"fsdp_sharding_stratgy": "FULL_SHARD"}))
    with pytest.raises(ConfigurationError, match="DRIVETRAIN_BACKEND_CONFIG.*fsdp_sharding_stratgy"):
        resolve_config(None)
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"state_dict_type": "NOPE"}))
    with pytest.raises(ConfigurationError, match="DRIVETRAIN_BACKEND_CONFIG.*state_dict_type"):
        resolve_config(None)


def test_from_accelerate_config_file(tmp_path, monkeypatch):
    path = tmp_path / "default_config.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
        "  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_cpu_ram_efficient_loading: true\n"
        "  fsdp_sync_module_states: true\n  fsdp_use_orig_params: true\n"
    )
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(path))
    plugin = resolve_config(None)
    assert (
        plugin.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
        and plugin.cpu_ram_efficient_loading is True
    )


def test_script_and_environment_merge_and_conflict(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"fsdp_state_dict_type": "FULL_STATE_DICT"}))
    merged = resolve_config(FullyShardedDataParallelPlugin(activation_checkpointing=True))
    assert merged.state_dict_type == StateDictType.FULL_STATE_DICT and merged.activation_checkpointing is True
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"fsdp_sharding_strategy": "NO_SHARD"}))
    with pytest.raises(ConfigurationError, match="conflicting fsdp setting 'sharding_strategy'"):
        resolve_config(FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP"))


def test_a_launcher_setting_conflicting_with_the_scripts_plugin_raises_naming_both(monkeypatch):
    # drivetrain launch --fsdp_sharding_strategy NO_SHARD hands its flags over in DRIVETRAIN_BACKEND_CONFIG
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"fsdp_sharding_strategy": "NO_SHARD"}))
    with pytest.raises(ConfigurationError) as caught:
        resolve_config(FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP"))
    message = str(caught.value)
    assert message.startswith("conflicting fsdp setting 'sharding_strategy': FullyShardedDataParallelPlugin(")
    assert "SHARD_GRAD_OP" in message and "NO_SHARD" in message and "DRIVETRAIN_BACKEND_CONFIG" in message


def test_the_config_file_fills_what_the_script_leaves_unset_and_conflicts_name_the_file(
    monkeypatch, tmp_path
):
    path = tmp_path / "config.yaml"
    path.write_text("backend: fsdp\nbackend_config:\n  activation_checkpointing: true\n  min_num_params: 5\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(path))
    mine = FullyShardedDataParallelPlugin(min_num_params=5, forward_prefetch=True)
    resolved = resolve_config(mine)
    assert resolved.activation_checkpointing and resolved.forward_prefetch and resolved.min_num_params == 5
    assert resolve_config(mine) is resolved  # one resolution per run, kept in the process state
    with pytest.raises(
        ConfigurationError, match=rf"min_num_params=7\) in the script but 5 from config file {path}"
    ):
        resolve_config(FullyShardedDataParallelPlugin(min_num_params=7))


def test_the_launcher_and_the_config_file_that_disagree_raise_naming_both(monkeypatch, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("backend: fsdp\nbackend_config:\n  min_num_params: 5\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(path))
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"fsdp_min_num_params": 6}))
    with pytest.raises(
        ConfigurationError, match=r"'min_num_params': 6 from environment DRIVETRAIN_BACKEND_CONFIG but 5"
    ):
        resolve_config(None)


def test_a_script_plugin_without_launcher_settings_is_used_as_it_is():
    mine = FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP")
    assert resolve_config(mine) is mine
    with pytest.raises(
        ConfigurationError,
        match="takes FullyShardedDataParallelPlugin objects as its configuration, got dict",
    ):
        resolve_config({})


def test_enable_ram_efficient_loading(monkeypatch):
    # setenv first so that monkeypatch restores the variable's absence after the function sets it
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    enable_fsdp_ram_efficient_loading()
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.cpu_ram_efficient_loading_enabled and plugin.sync_module_states_enabled


def test_exports_and_cli_command():
    import drivetrain
    from drivetrain.contract.registry import get_plugin_registry

    assert drivetrain.FullyShardedDataParallelPlugin is FullyShardedDataParallelPlugin
    assert drivetrain.merge_fsdp_weights is merge_fsdp_weights
    manager = get_plugin_registry()
    assert manager.info("fsdp").kind == "backend" and manager.info("fsdp").places_model
    manager.load("fsdp")
    assert manager.extensions.commands["merge-weights"][0] == "fsdp"


def test_merge_refuses_a_folder_that_is_not_sharded(tmp_path):
    with pytest.raises(CheckpointError, match="not a sharded FSDP checkpoint"):
        merge_fsdp_weights(str(tmp_path), str(tmp_path / "out"))


# -- Accelerate's remaining fields and methods -------------------------------------------------------------------
def test_state_dict_configs_follow_the_type_and_set_state_dict_type_switches_them():
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedStateDictConfig

    plugin = FullyShardedDataParallelPlugin()
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert (
        isinstance(plugin.state_dict_config, ShardedStateDictConfig)
        and plugin.state_dict_config.offload_to_cpu
    )
    plugin.set_state_dict_type("FULL_STATE_DICT")  # train sharded, save the final model whole
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    assert plugin.state_dict_config == FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    assert isinstance(plugin.optim_state_dict_config, FullOptimStateDictConfig)
    # FSDP1 defaults to a full state dict, as in Accelerate; a config the user gives is kept.
    assert FullyShardedDataParallelPlugin(fsdp_version=1).state_dict_type == StateDictType.FULL_STATE_DICT
    mine = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
    kept = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT", state_dict_config=mine)
    assert kept.state_dict_config is mine


def test_merging_the_environment_rederives_the_state_dict_configs(monkeypatch):
    from torch.distributed.fsdp import FullStateDictConfig

    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"fsdp_state_dict_type": "FULL_STATE_DICT"}))
    merged = resolve_config(FullyShardedDataParallelPlugin(min_num_params=10))
    assert isinstance(merged.state_dict_config, FullStateDictConfig)


def test_cpu_offload_and_mixed_precision_become_each_versions_objects():
    from torch.distributed.fsdp import (
        CPUOffload,
        CPUOffloadPolicy,
        MixedPrecision,
        MixedPrecisionPolicy,
        OffloadPolicy,
    )

    two = FullyShardedDataParallelPlugin(cpu_offload=True, mixed_precision_policy="bf16")
    assert isinstance(two.cpu_offload, CPUOffloadPolicy) and two.offloads_params
    assert isinstance(two.mixed_precision_policy, MixedPrecisionPolicy)
    assert type(FullyShardedDataParallelPlugin().cpu_offload) is OffloadPolicy
    one = FullyShardedDataParallelPlugin(fsdp_version=1, cpu_offload=True, mixed_precision_policy="bf16")
    assert one.cpu_offload == CPUOffload(offload_params=True) and one.offloads_params
    assert isinstance(one.mixed_precision_policy, MixedPrecision)
    assert one.mixed_precision_policy.buffer_dtype == torch.bfloat16
    one.validate_cpu_offload()
    one.validate_mixed_precision_policy()
    # set_mixed_precision keeps a policy unless override, as Accelerate's does.
    one.set_mixed_precision("fp16")
    assert one.mixed_precision_policy.param_dtype == torch.bfloat16
    one.set_mixed_precision("fp16", buffer_autocast=True, override=True)
    assert (one.mixed_precision_policy.param_dtype, one.mixed_precision_policy.buffer_dtype) == (
        torch.float16,
        torch.float32,
    )
    with pytest.raises(ConfigurationError, match="set_mixed_precision\\('int8'\\)"):
        one.set_mixed_precision("int8", override=True)
    one.cpu_offload = True
    with pytest.raises(ConfigurationError, match="cpu_offload must be a torch.distributed.fsdp.CPUOffload"):
        one.validate_cpu_offload()
    one.set_cpu_offload()
    assert one.cpu_offload == CPUOffload(offload_params=True)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {"activation_checkpointing_offload": True},
            ["activation_checkpointing_offload", "activation_checkpointing=True"],
        ),
        (
            {"activation_checkpointing": True, "activation_checkpointing_offload": True, "fsdp_version": 1},
            ["activation_checkpointing_offload", "fsdp_version=2"],
        ),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, ["LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]),
        ({"param_init_fn": 3}, ["param_init_fn", "callable"]),
        ({"state_dict_config": "full"}, ["state_dict_config", "StateDictConfig"]),
        ({"reshard_after_forward": "HYBRID_SHARD", "sharding_strategy": "SHARD_GRAD_OP"}, ["set only one"]),
        ({"limit_all_gathers": "sometimes"}, ["limit_all_gathers"]),
    ],
)
def test_new_fields_are_checked(fields, words):
    with pytest.raises(ConfigurationError) as raised:
        FullyShardedDataParallelPlugin(**fields)
    assert all(word in str(raised.value) for word in words), str(raised.value)


def test_reshard_after_forward_naming_a_strategy_is_accelerates_fsdp1_spelling():
    plugin = FullyShardedDataParallelPlugin(fsdp_version=1, reshard_after_forward="SHARD_GRAD_OP")
    assert plugin.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP and plugin.reshard_after_forward is None


def test_set_auto_wrap_policy_gives_torchs_fsdp1_callable():
    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

    model = torch.nn.Sequential(Layer(), Layer(), torch.nn.Linear(2, 1))
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Layer"])
    plugin.set_auto_wrap_policy(model)
    policy = plugin.auto_wrap_policy
    assert policy(module=model[0], recurse=False, nonwrapped_numel=6)
    assert not policy(module=model[2], recurse=False, nonwrapped_numel=3)


def test_to_fsdp2_converts_accelerate_and_drivetrain_files(tmp_path, capsys):
    import yaml

    from drivetrain.commands.main import main as drivetrain_main

    accelerate = tmp_path / "accelerate.yaml"
    accelerate.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
        "  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_use_orig_params: true\n  fsdp_backward_prefetch: BACKWARD_PRE\n"
        "  fsdp_transformer_layer_cls_to_wrap: BertLayer\n  fsdp_version: 1\n"
    )
    assert (
        drivetrain_main(
            ["to-fsdp2", "--config_file", str(accelerate), "--output_file", str(tmp_path / "a2.yaml")]
        )
        == 0
    )
    converted = yaml.safe_load((tmp_path / "a2.yaml").read_text())["fsdp_config"]
    assert converted == {
        "fsdp_reshard_after_forward": False,
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_version": 2,
    }
    assert "fsdp_use_orig_params dropped" in capsys.readouterr().err
    # The converted file builds an FSDP2 plugin.
    import os

    from drivetrain.config.sources import CONFIG_FILE_ENV

    os.environ[CONFIG_FILE_ENV] = str(tmp_path / "a2.yaml")
    try:
        plugin = resolve_config(None)
    finally:
        del os.environ[CONFIG_FILE_ENV]
    assert plugin.fsdp_version == 2 and plugin.effective_reshard_after_forward is False

    native = tmp_path / "drivetrain.yaml"
    native.write_text(
        "backend: fsdp\nbackend_config:\n  sharding_strategy: FULL_SHARD\n  sync_module_states: true\n"
    )
    assert drivetrain_main(["to-fsdp2", "--config_file", str(native), "--overwrite"]) == 0
    assert yaml.safe_load(native.read_text())["backend_config"] == {
        "reshard_after_forward": True,
        "fsdp_version": 2,
    }
    assert (
        drivetrain_main(["to-fsdp2", "--config_file", str(native)]) == 2
    )  # neither --output_file nor --overwrite


def test_accelerates_fsdp_helpers_are_exported():
    from drivetrain_fsdp import helpers

    import drivetrain.utils as utils
    from drivetrain.compat.install_hints import PLUGIN_EXPORTS

    for name in helpers.__all__:
        assert getattr(utils, name) is getattr(helpers, name)
        assert PLUGIN_EXPORTS[name] == "drivetrain-fsdp"  # the hint when the plugin is not installed


def test_state_fsdp_plugin_is_none_outside_fsdp_runs():
    from drivetrain import Accelerator, AcceleratorState

    Accelerator(cpu=True)
    assert AcceleratorState().fsdp_plugin is None


def test_accelerate_to_fsdp2_entry_points_convert_a_file(tmp_path):
    """Accelerate's ``to_fsdp2_command_parser`` / ``to_fsdp2_command`` (importable from
    ``drivetrain.commands.to_fsdp2``): FSDP1 keys converted, removed ones dropped, bad arguments refused."""
    import yaml

    from drivetrain.commands.to_fsdp2 import to_fsdp2_command, to_fsdp2_command_parser

    source = tmp_path / "fsdp1.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "distributed_type": "FSDP",
                "fsdp_config": {
                    "fsdp_sharding_strategy": "SHARD_GRAD_OP",
                    "fsdp_use_orig_params": True,
                    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                },
            }
        )
    )
    target = tmp_path / "fsdp2.yaml"
    parser = to_fsdp2_command_parser()
    to_fsdp2_command(parser.parse_args(["--config_file", str(source), "--output_file", str(target)]))
    assert yaml.safe_load(target.read_text())["fsdp_config"] == {
        "fsdp_reshard_after_forward": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_version": 2,
    }
    with pytest.raises(FileExistsError):
        to_fsdp2_command(parser.parse_args(["--config_file", str(source), "--output_file", str(target)]))
    with pytest.raises(ValueError, match="--output_file must be provided"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(source)]))
    with pytest.raises(FileNotFoundError):
        to_fsdp2_command(parser.parse_args(["--config_file", str(tmp_path / "nope.yaml"), "--overwrite"]))


def test_get_parameters_from_modules_as_accelerate():
    # trl prepares a model for FSDP2 through accelerate.utils.fsdp_utils.get_parameters_from_modules
    from drivetrain.utils import fsdp_utils

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    assert fsdp_utils.get_parameters_from_modules(None, model, "cpu") == set()
    assert fsdp_utils.get_parameters_from_modules([model[2]], model, "cpu") == set(model[2].parameters())
    by_name = fsdp_utils.get_parameters_from_modules(r"0|2", model, torch.device("meta"))
    assert {id(p) for p in by_name} == {id(p) for p in [*model[0].parameters(), *model[2].parameters()]}
    assert all(p.device.type == "meta" for p in by_name)  # as in Accelerate, modules found by name are moved
    assert fsdp_utils.get_parameters_from_modules(r"1", model, "cpu") == set()  # full match; ReLU has none


def test_adapter_only_concerns_peft_models_only(tmp_path):
    # transformers' Trainer passes adapter_only=True to save_fsdp_model for every model; Accelerate saves the
    # whole state of a model that is not a PEFT model
    from drivetrain_fsdp.helpers import _refuse_adapter_only

    model = torch.nn.Linear(2, 2)
    _refuse_adapter_only(True, model)  # nothing refused
    peft_like = torch.nn.Linear(2, 2)
    peft_like.peft_config = {}
    peft_like.get_base_model = lambda: model
    with pytest.raises(CheckpointError, match="adapter_only=True"):
        _refuse_adapter_only(True, peft_like)


@pytest.mark.multiprocess
def test_a_launch_flag_conflicting_with_the_scripts_plugin_stops_the_job(tmp_path):
    """`drivetrain launch --use_fsdp --fsdp_sharding_strategy NO_SHARD` on a script that passes its own
    FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP"): each process refuses, naming both."""
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "from drivetrain import Accelerator, FullyShardedDataParallelPlugin\n"
        "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(sharding_strategy='SHARD_GRAD_OP'))\n"
        "print('no conflict detected', flush=True)\n"
    )
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("DRIVETRAIN_")},
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "DRIVETRAIN_CONFIG_DIR": str(tmp_path / "no-config"),
    }
    flags = ["--cpu", "--num_processes", "2", "--use_fsdp", "--fsdp_sharding_strategy", "NO_SHARD"]
    result = subprocess.run(
        [sys.executable, "-m", "drivetrain.launch", *flags, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode != 0 and "no conflict detected" not in result.stdout
    assert (
        "ConfigurationError: conflicting fsdp setting 'sharding_strategy': FullyShardedDataParallelPlugin("
        "sharding_strategy='SHARD_GRAD_OP') in the script but 'NO_SHARD' from environment DRIVETRAIN_BACKEND_CONFIG"
    ) in result.stderr, result.stderr[-3000:]
    assert "process of global rank" in result.stderr.strip().splitlines()[-1]


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_accelerates_get_grad_scaler_for_fsdp_is_torchs_sharded_scaler():
    """Declared by the plugin (PluginInfo.grad_scaler), as Accelerate's get_grad_scaler gives for FSDP."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from drivetrain.utils import DistributedType, get_grad_scaler

    assert isinstance(
        get_grad_scaler(distributed_type=DistributedType.FSDP, init_scale=8.0), ShardedGradScaler
    )
