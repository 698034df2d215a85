"""Accelerate's ``DeepSpeedPlugin`` / ``HfDeepSpeedConfig`` surface on real DeepSpeed configs (the seed's
templates): fields, the config methods a script or library calls, and the launcher's multi-node options.
No process group is needed."""

from __future__ import annotations

import base64
import copy
import json
import types

import pytest
from drivetrain_deepspeed import DeepSpeedPlugin, HfDeepSpeedConfig
from drivetrain_deepspeed.launcher import launch_with_deepspeed, runner_command

from drivetrain.errors import ConfigurationError

#: The seed's "ZeRO Stage-3 with CPU offload DeepSpeed Config File Example".
ZERO3_OFFLOAD = {
    "fp16": {
        "enabled": True,
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "sub_group_size": 1e9,
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": "auto",
    },
    "gradient_accumulation_steps": 1,
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}


# -- fields -----------------------------------------------------------------------------------------------------
def test_fields_are_read_back_from_a_config_file(tmp_path):
    """Scripts branch on ``accelerator.state.deepspeed_plugin.zero_stage`` whether the plugin was built from
    fields or from a config file; as in Accelerate the fields hold the config's values."""
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps(ZERO3_OFFLOAD))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path), gradient_clipping=1.0)
    assert plugin.zero_stage == 3 and plugin.offload_optimizer_device == "cpu"
    assert plugin.offload_param_device == "cpu" and plugin.gradient_accumulation_steps == 1
    assert plugin.gradient_clipping == 1.0 and plugin.deepspeed_config["gradient_clipping"] == 1.0
    assert plugin.zero3_init_flag is True  # Accelerate's default for a stage-3 config
    assert isinstance(plugin.hf_ds_config, HfDeepSpeedConfig)
    assert plugin.hf_ds_config.config is plugin.deepspeed_config and plugin.hf_ds_config.is_offload()
    assert (
        plugin.is_train_batch_min is True and plugin.enable_msamp is False and plugin.msamp_opt_level == "O1"
    )

    built = DeepSpeedPlugin(zero_stage=1)
    assert (
        built.zero_stage == 1 and built.offload_optimizer_device == "none" and built.zero3_init_flag is False
    )


def test_zero3_init_flag_outside_stage_3_is_turned_off_with_a_warning():
    with pytest.warns(UserWarning, match="zero3_init_flag=True applies to ZeRO stage 3 only"):
        plugin = DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert plugin.zero3_init_flag is False and not plugin.is_zero3_init_enabled()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"is_train_batch_min": "maybe"}, r"is_train_batch_min='maybe' is not valid; expected true or false"),
        ({"msamp_opt_level": "O3"}, r"msamp_opt_level='O3' is not valid; expected 'O1' or 'O2'"),
        ({"enable_msamp": True}, r"enable_msamp=True: MS-AMP FP8 is not available"),
    ],
)
def test_new_fields_reject_bad_values_naming_the_field(kwargs, expected):
    with pytest.raises(ConfigurationError, match=expected):
        DeepSpeedPlugin(**kwargs)


# -- the config methods -------------------------------------------------------------------------------------------
def test_get_value_is_auto_and_fill_match_on_the_seed_template():
    plugin = DeepSpeedPlugin(hf_ds_config=ZERO3_OFFLOAD)
    assert plugin.get_value("zero_optimization.stage") == 3
    assert plugin.get_value("zero_optimization.nothing", "default") == "default"
    assert plugin.is_auto("zero_optimization.reduce_bucket_size") and not plugin.is_auto("steps_per_print")
    assert not plugin.is_auto("not.there")

    plugin.fill_match("zero_optimization.reduce_bucket_size", **{"zero_optimization.reduce_bucket_size": 64})
    assert plugin.get_value("zero_optimization.reduce_bucket_size") == 64
    mismatches: list[str] = []
    plugin.fill_match("steps_per_print", mismatches, steps_per_print=10)
    assert mismatches == ["steps_per_print: config 2000 vs given 10"]
    plugin.fill_match("steps_per_print", mismatches, must_match=False, steps_per_print=10)
    assert len(mismatches) == 1 and plugin.get_value("steps_per_print") == 2000  # explicit values stay
    with pytest.raises(ConfigurationError, match=r'train_batch_size is "auto" but no value was given'):
        plugin.fill_match("train_batch_size")
    assert ZERO3_OFFLOAD["zero_optimization"]["reduce_bucket_size"] == "auto"  # the user's dict is untouched


def test_deepspeed_config_process_fills_every_auto_as_prepare_does():
    """What Accelerate's prepare passes (batch sizes, clipping, hidden-size buckets, DummyOptim/DummyScheduler
    values) fills every "auto" of the template; explicit values that differ are one error listing them."""
    plugin = DeepSpeedPlugin(hf_ds_config=ZERO3_OFFLOAD, gradient_clipping=1.0)
    hidden = 32
    values = {
        "train_micro_batch_size_per_gpu": 4,
        "train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "zero_optimization.reduce_bucket_size": hidden * hidden,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
        "optimizer.params.lr": 0.01,
        "optimizer.params.weight_decay": 0.0,
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": 0.01,
        "scheduler.params.warmup_num_steps": 10,
        "scheduler.params.total_num_steps": 100,
    }
    plugin.deepspeed_config_process(**values)
    config = plugin.deepspeed_config
    assert config["zero_optimization"]["reduce_bucket_size"] == 1024
    assert config["zero_optimization"]["stage3_param_persistence_threshold"] == 320
    assert config["optimizer"]["params"] == {"lr": 0.01, "weight_decay": 0.0}
    assert config["scheduler"]["params"]["total_num_steps"] == 100 and config["train_batch_size"] == 8
    assert "auto" not in json.dumps(config)
    assert plugin.hf_ds_config.is_zero3()

    other = DeepSpeedPlugin(hf_ds_config=ZERO3_OFFLOAD)
    wrong = {**values, "gradient_clipping": 1.0, "zero_optimization.stage": 2, "steps_per_print": 10}
    with pytest.raises(
        ConfigurationError, match=r"zero_optimization\.stage: config 3 vs given 2; steps_per_print"
    ):
        other.deepspeed_config_process(**wrong)
    other = DeepSpeedPlugin(hf_ds_config=ZERO3_OFFLOAD)
    other.deepspeed_config_process(must_match=False, **wrong)  # mismatches ignored, autos filled
    assert other.deepspeed_config["zero_optimization"]["stage"] == 3
    with pytest.raises(ConfigurationError, match=r"optimizer\.params\.lr is \"auto\""):
        DeepSpeedPlugin(hf_ds_config=ZERO3_OFFLOAD).deepspeed_config_process(train_batch_size=8)


def test_set_mixed_precision_fills_the_precision_sections():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}})
    plugin.set_mixed_precision("bf16")
    assert plugin.deepspeed_config["bf16"] == {"enabled": True}
    assert plugin.deepspeed_config["fp16"] == {"enabled": False}

    fields = DeepSpeedPlugin(zero_stage=1)
    fields.set_mixed_precision("no")
    assert (
        fields.deepspeed_config["bf16"]["enabled"] is False
        and fields.deepspeed_config["fp16"]["enabled"] is False
    )

    fp16 = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}})
    fp16.set_mixed_precision("fp16")
    assert fp16.deepspeed_config["fp16"] == {"enabled": True, "auto_cast": True}

    with pytest.raises(
        ConfigurationError, match="mixed_precision='bf16' but the DeepSpeed config enables fp16"
    ):
        DeepSpeedPlugin(hf_ds_config=ZERO3_OFFLOAD).set_mixed_precision("bf16")
    with pytest.raises(ConfigurationError, match=r"set_mixed_precision\('fp8'\): the deepspeed backend"):
        DeepSpeedPlugin().set_mixed_precision("fp8")
    with pytest.raises(ConfigurationError, match="expected 'no', 'fp16' or 'bf16'"):
        DeepSpeedPlugin().set_mixed_precision("fp32")


def test_a_plugin_is_selected_only_through_the_state():
    plugin = DeepSpeedPlugin()
    assert plugin.selected is False
    with pytest.raises(ConfigurationError, match=r"select_deepspeed_plugin\(name\)"):
        plugin.select()
    with pytest.raises(AttributeError, match="selected is read-only"):
        plugin.selected = True
    plugin.select(_from_accelerator_state=True)
    assert plugin.selected


# -- HfDeepSpeedConfig -----------------------------------------------------------------------------------------------
def test_hf_deepspeed_config_takes_accelerates_argument_and_forms(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ZERO3_OFFLOAD))
    text = json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})
    for source in (
        str(path),
        path,
        text,
        base64.urlsafe_b64encode(text.encode()).decode(),
    ):
        config = HfDeepSpeedConfig(config_file_or_dict=source)
        assert config.is_offload() and (config.is_zero2() or config.is_zero3())
    mine = copy.deepcopy(ZERO3_OFFLOAD)
    config = HfDeepSpeedConfig(mine)
    config.del_config_sub_tree("zero_optimization.offload_param")
    config.del_config_sub_tree("not.there")
    assert (
        "offload_param" not in config.config["zero_optimization"]
        and "offload_param" in mine["zero_optimization"]
    )
    with pytest.raises(ConfigurationError, match="no 'not.there' entry"):
        config.del_config_sub_tree("not.there", must_exist=True)
    assert config.is_true("zero_optimization.overlap_comm") and config.is_false("wall_clock_breakdown")
    assert not config.is_true("missing") and not config.is_false("missing")
    # Offload is reported at stages 2 and 3 only, as Accelerate does.
    assert not HfDeepSpeedConfig(
        {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
    ).is_offload()
    with pytest.raises(ConfigurationError, match="does not exist"):
        HfDeepSpeedConfig(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigurationError, match="must be a dict, a path"):
        HfDeepSpeedConfig(3)  # type: ignore[arg-type]


# -- every Accelerate config key and launch flag --------------------------------------------------------------------
#: Every key ``accelerate config`` writes in the ``deepspeed_config`` section.
ACCELERATE_SECTION = {
    "deepspeed_config_file": None,
    "zero_stage": 3,
    "offload_optimizer_device": "cpu",
    "offload_param_device": "cpu",
    "offload_optimizer_nvme_path": "none",
    "offload_param_nvme_path": "none",
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5,
    "zero3_init_flag": True,
    "zero3_save_16bit_model": True,
    "deepspeed_moe_layer_cls_names": "MixtralSparseMoeBlock,Qwen2MoeSparseMoeBlock",
    "deepspeed_hostfile": "/etc/hostfile",
    "deepspeed_multinode_launcher": "pdsh",
    "deepspeed_inclusion_filter": "node1",
    "deepspeed_exclusion_filter": None,
}


def test_every_accelerate_config_key_and_flag_reaches_the_plugin(tmp_path, monkeypatch):
    """An Accelerate config file with the whole ``deepspeed_config`` section, overridden by flags, as
    ``drivetrain launch`` hands it to the processes."""
    import yaml
    from drivetrain_deepspeed.config import resolve_config

    from drivetrain.commands.launch import build_parser, environment_for, resolve_plan

    config_file = tmp_path / "accelerate.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {"distributed_type": "DEEPSPEED", "num_processes": 2, "deepspeed_config": ACCELERATE_SECTION}
        )
    )
    flags = [
        "--config_file",
        str(config_file),
        "--gradient_clipping",
        "0.25",
        "--zero3_init_flag",
        "false",
        "t.py",
    ]
    plan = resolve_plan(build_parser().parse_args(flags), environ={})
    environment = environment_for(plan)
    for name in ("DRIVETRAIN_BACKEND_CONFIG", "DRIVETRAIN_BACKEND"):
        monkeypatch.setenv(name, environment[name])
    plugin = resolve_config(None)
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 3
    assert plugin.deepspeed_config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert plugin.deepspeed_config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 2
    assert plugin.deepspeed_config["gradient_clipping"] == 0.25  # the flag wins over the file
    assert plugin.zero3_init_flag is False
    assert plugin.transformer_moe_cls_names == ["MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock"]
    backend_config = json.loads(environment["DRIVETRAIN_BACKEND_CONFIG"])
    assert backend_config["deepspeed_hostfile"] == "/etc/hostfile"  # read by the launcher, not the plugin
    assert backend_config["deepspeed_inclusion_filter"] == "node1"


def _runner_args(hostfile, **overrides):
    values = {
        "deepspeed_hostfile": str(hostfile),
        "deepspeed_multinode_launcher": None,
        "deepspeed_inclusion_filter": None,
        "deepspeed_exclusion_filter": None,
        "main_process_ip": "10.0.0.1",
        "main_process_port": 29501,
        "machine_rank": 1,
        "module": False,
        "no_python": False,
    }
    values.update(overrides)
    return types.SimpleNamespace(**values)


def test_multinode_launchers_of_accelerate(tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=8\nnode2 slots=8\n")
    nossh = " ".join(
        runner_command(_runner_args(hostfile, deepspeed_multinode_launcher="nossh"), ["t.py"], "")
    )
    assert "--no_ssh --node_rank 1" in nossh and "--launcher" not in nossh  # each machine runs its runner
    excluded = runner_command(_runner_args(hostfile, deepspeed_exclusion_filter="node2:0"), ["t.py"], "")
    assert excluded[excluded.index("--exclude") + 1] == "node2:0"
    # "standard" is torch's launcher on every machine: the hostfile is not used.
    assert (
        launch_with_deepspeed(_runner_args(hostfile, deepspeed_multinode_launcher="standard"), ["t.py"])
        is None
    )
    both = _runner_args(hostfile, deepspeed_inclusion_filter="node1", deepspeed_exclusion_filter="node2")
    assert launch_with_deepspeed(both, ["t.py"]) == 2
    assert (
        "--deepspeed_inclusion_filter 'node1' and --deepspeed_exclusion_filter 'node2'"
        in capsys.readouterr().err
    )


def test_unknown_multinode_launcher_flag_is_refused():
    from drivetrain.commands.launch import build_parser
    from drivetrain.errors import UsageError

    with pytest.raises(UsageError, match="--deepspeed_multinode_launcher.*invalid choice: 'rsh' .*'nossh'"):
        build_parser().parse_args(["--deepspeed_multinode_launcher", "rsh", "t.py"])
