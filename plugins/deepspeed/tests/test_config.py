"""DeepSpeedPlugin, HfDeepSpeedConfig and the launcher's settings: no process group needed."""

from __future__ import annotations

import json
import types

import pytest
from drivetrain_deepspeed import (
    DeepSpeedPlugin,
    HfDeepSpeedConfig,
    get_active_deepspeed_plugin,
    select_deepspeed_plugin,
)
from drivetrain_deepspeed.config import resolve_config
from drivetrain_deepspeed.launcher import runner_command

from drivetrain import reset_state
from drivetrain.errors import ConfigurationError


def test_fields_build_a_config():
    plugin = DeepSpeedPlugin(
        zero_stage=3,
        gradient_accumulation_steps=4,
        gradient_clipping=1.0,
        offload_optimizer_device="cpu",
        offload_param_device="cpu",
        zero3_save_16bit_model=True,
    )
    config = plugin.deepspeed_config
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert config["gradient_accumulation_steps"] == 4 and config["gradient_clipping"] == 1.0
    assert config["train_micro_batch_size_per_gpu"] == "auto"
    assert DeepSpeedPlugin.backend_name == "deepspeed"
    assert DeepSpeedPlugin().stage == 2  # Accelerate's default stage


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("zero_stage", 4, "0, 1, 2 or 3"),
        ("gradient_accumulation_steps", 0, ">= 1"),
        ("gradient_clipping", -1.0, ">= 0 \\(0: no clipping\\)"),
        ("offload_optimizer_device", "gpu", "none, cpu, nvme"),
        ("hf_ds_config", 3, "JSON config"),
    ],
)
def test_invalid_fields_name_the_field(field, value, expected):
    with pytest.raises(ConfigurationError, match=rf"DeepSpeedPlugin\.{field}=.*{expected}"):
        DeepSpeedPlugin(**{field: value})


def test_nvme_needs_a_path_and_param_offload_needs_stage_3():
    with pytest.raises(ConfigurationError, match="offload_optimizer_nvme_path"):
        DeepSpeedPlugin(offload_optimizer_device="nvme")
    with pytest.raises(ConfigurationError, match="zero_stage=3"):
        DeepSpeedPlugin(zero_stage=2, offload_param_device="cpu")


def test_config_file_auto_values_are_filled_by_fields(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps(
            {
                "zero_optimization": {"stage": "auto", "offload_optimizer": {"device": "auto"}},
                "gradient_clipping": "auto",
                "train_micro_batch_size_per_gpu": "auto",
            }
        )
    )
    plugin = DeepSpeedPlugin(
        hf_ds_config=str(path), zero_stage=1, gradient_clipping=0.3, offload_optimizer_device="cpu"
    )
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 1
    assert plugin.deepspeed_config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert plugin.deepspeed_config["gradient_clipping"] == 0.3
    assert json.loads(path.read_text())["gradient_clipping"] == "auto"  # the file is not changed


def test_field_contradicting_the_config_names_both():
    with pytest.raises(ConfigurationError, match=r"zero_optimization\.stage.*says 3.*zero_stage=2"):
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}}, zero_stage=2)


def test_bad_config_file_is_named(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        DeepSpeedPlugin(hf_ds_config=str(broken))


def test_hf_deepspeed_config_queries():
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
    assert config.is_zero3() and not config.is_zero2() and config.is_offload()
    assert config.get_value("zero_optimization.stage") == 3
    assert config.get_value("zero_optimization.missing.deeper", "default") == "default"


def test_accelerate_config_file_section_and_launch_flags(monkeypatch, tmp_path):
    """The config file's deepspeed_config section and `--zero_stage` etc. arrive as DRIVETRAIN_BACKEND_CONFIG."""
    ds_file = tmp_path / "ds.json"
    ds_file.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    monkeypatch.setenv(
        "DRIVETRAIN_BACKEND_CONFIG",
        json.dumps(
            {
                "deepspeed_config_file": str(ds_file),
                "zero3_init_flag": True,
                "deepspeed_hostfile": "hosts",
                "deepspeed_moe_layer_cls_names": "MixtralSparseMoeBlock,Block",
                "offload_param_nvme_path": "none",
            }
        ),
    )
    plugin = resolve_config(None)
    assert plugin.stage == 3 and plugin.is_zero3_init_enabled()
    assert plugin.transformer_moe_cls_names == ["MixtralSparseMoeBlock", "Block"]
    reset_state()  # resolved once per run: a new environment needs a new run
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"zero_stgae": 1}))
    with pytest.raises(
        ConfigurationError, match="DRIVETRAIN_BACKEND_CONFIG: unknown deepspeed setting 'zero_stgae'"
    ):
        resolve_config(None)


def test_a_launcher_setting_conflicting_with_the_scripts_plugin_raises_naming_both(monkeypatch):
    # drivetrain launch --zero_stage 3 hands its flags over in DRIVETRAIN_BACKEND_CONFIG
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"zero_stage": 3}))
    with pytest.raises(ConfigurationError) as caught:
        resolve_config(DeepSpeedPlugin(zero_stage=2))
    assert str(caught.value) == (
        "conflicting deepspeed setting 'zero_stage': DeepSpeedPlugin(zero_stage=2) in the script but 3 from "
        "environment DRIVETRAIN_BACKEND_CONFIG; remove one of them or make them agree"
    )


def test_launcher_settings_fill_what_the_scripts_plugin_leaves_unset_in_place(monkeypatch):
    # Before, a script's DeepSpeedPlugin silently ignored the launcher's settings.
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"zero_stage": 3, "gradient_clipping": 0.5}))
    mine = DeepSpeedPlugin(gradient_clipping=0.5, offload_optimizer_device="cpu")
    resolved = resolve_config(mine)
    assert resolved is mine  # the script keeps its object (selection, transformers' reference)
    assert mine.stage == 3 and mine.gradient_clipping == 0.5 and mine.offload_optimizer_device == "cpu"
    assert mine.deepspeed_config["zero_optimization"]["stage"] == 3


def test_accelerates_deepspeed_variables_are_read_below_the_launcher(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", "none")  # Accelerate's "unset"
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "auto")
    assert resolve_config(None).stage == 3
    with pytest.raises(
        ConfigurationError,
        match="DeepSpeedPlugin\\(zero_stage=1\\) in the script but 3 from environment variable "
        "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    ):
        resolve_config(DeepSpeedPlugin(zero_stage=1))


def test_selecting_among_several_plugins():
    plugins = {"student": DeepSpeedPlugin(zero_stage=2), "teacher": DeepSpeedPlugin(zero_stage=3)}
    state = types.SimpleNamespace(backend_name="deepspeed", backend_config=plugins)
    assert get_active_deepspeed_plugin(state) is plugins["student"]
    assert select_deepspeed_plugin(state, "teacher") is plugins["teacher"]
    assert get_active_deepspeed_plugin(state) is plugins["teacher"] and not plugins["student"].selected
    with pytest.raises(ConfigurationError, match="'student', 'teacher'"):
        select_deepspeed_plugin(state, "critic")


def test_runner_command_for_a_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=8\nnode2 slots=8\n")
    args = types.SimpleNamespace(
        deepspeed_hostfile=str(hostfile),
        deepspeed_multinode_launcher="openmpi",
        deepspeed_inclusion_filter="node1@node2:0,1",
        deepspeed_exclusion_filter=None,
        main_process_ip="10.0.0.1",
        main_process_port=29501,
        module=False,
        no_python=False,
    )
    command = runner_command(args, ["train.py", "--lr", "1"], "envfile")
    assert command[1:3] == ["-m", "deepspeed.launcher.runner"]
    assert "--no_ssh_check" not in command  # remote hosts: DeepSpeed checks ssh itself
    joined = " ".join(command)
    assert "--launcher openmpi" in joined and "--include node1@node2:0,1" in joined
    assert "--master_addr 10.0.0.1 --master_port 29501" in joined and joined.endswith("train.py --lr 1")


def test_the_plugin_declares_deepspeed_sequence_parallelism():
    """ParallelismConfig's sp_backend values come from the backends' declarations (PluginInfo.sp_backend)."""
    from drivetrain_deepspeed.plugin import PLUGIN_INFO

    from drivetrain.contract.registry import get_plugin_registry

    assert PLUGIN_INFO.sp_backend == "deepspeed"
    assert "deepspeed" in get_plugin_registry().sequence_parallel_backends()


def test_sequence_parallel_config_defaults_to_variable_lengths_and_checks_attention(monkeypatch):
    from drivetrain.utils import DeepSpeedSequenceParallelConfig, ParallelismConfig

    handler = DeepSpeedSequenceParallelConfig()
    assert handler.sp_seq_length_is_variable is True and handler.sp_attn_implementation is None
    config = ParallelismConfig(sp_backend="deepspeed", sp_size=2, sp_handler=handler)
    assert config.sp_handler is handler
    assert DeepSpeedSequenceParallelConfig(sp_attn_implementation="kernels-community/flash-attn2")
    with pytest.raises(ValueError, match="Invalid sp_attn_implementation 'foobar'"):
        DeepSpeedSequenceParallelConfig(sp_attn_implementation="foobar")
    with pytest.raises(ValueError, match="sp_seq_length"):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "4096")
    assert DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False).sp_seq_length == 4096


def test_a_config_object_given_is_kept_and_shares_its_dict():
    # transformers builds DeepSpeedPlugin(hf_ds_config=HfTrainerDeepSpeedConfig(...)) and fills the "auto"
    # entries afterwards through that object (trainer_config_finalize): the plugin must keep it, as Accelerate
    class TrainerConfig(HfDeepSpeedConfig):
        def finalize(self):
            self.config["train_micro_batch_size_per_gpu"] = 4

    given = TrainerConfig({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"})
    plugin = DeepSpeedPlugin(hf_ds_config=given)
    assert plugin.hf_ds_config is given
    assert plugin.deepspeed_config is given.config
    given.finalize()
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 4
    assert plugin.zero_stage == 2


def test_ulysses_data_loader_adapter_without_sequence_parallelism_is_the_loader():
    # Accelerate's Accelerator.deepspeed_ulysses_dl_adapter, which the Trainer calls under DeepSpeed sequence
    # parallelism; with sp_size 1 (or no parallelism config) it returns the loader itself
    from drivetrain_deepspeed.sequence_parallel import state_ulysses_dl_adapter

    from drivetrain.utils import ParallelismConfig

    loader = object()
    state = types.SimpleNamespace(parallelism_config=None)
    assert state_ulysses_dl_adapter(state)(loader, None) is loader
    state.parallelism_config = ParallelismConfig(sp_backend="deepspeed", sp_size=1)
    assert state_ulysses_dl_adapter(state)(loader, None) is loader


def test_the_accelerator_has_the_ulysses_adapter():
    from drivetrain import Accelerator

    accelerator = Accelerator(cpu=True)
    loader = [1, 2]
    assert accelerator.deepspeed_ulysses_dl_adapter(loader, None) is loader
