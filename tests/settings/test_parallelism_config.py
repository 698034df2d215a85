"""ParallelismConfig: Accelerate's fields and views, its sources (constructor, environment, config file, launch
flags), the kernel's checks (world size, what the backend declares), and the Accelerator's N-D accessors.
The layouts themselves run in plugins/fsdp/tests/test_nd_parallelism.py."""

from __future__ import annotations

import warnings

import pytest

from drivetrain import Accelerator
from drivetrain.commands.launch import environment_for, parse_arguments, resolve_plan
from drivetrain.commands.parsing import UsageError
from drivetrain.config.parallelism import (
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)
from drivetrain.errors import ConfigurationError


def test_accelerate_import_paths():
    from drivetrain import ParallelismConfig as top_level
    from drivetrain.parallelism_config import ParallelismConfig as accelerate_path
    from drivetrain.utils import ParallelismConfig as from_utils
    from drivetrain.utils import TorchContextParallelConfig as handler

    assert top_level is accelerate_path is from_utils is ParallelismConfig
    assert handler is TorchContextParallelConfig


def test_defaults_are_ones_and_views_follow_accelerate():
    config = ParallelismConfig()
    assert (
        config.dp_replicate_size,
        config.dp_shard_size,
        config.tp_size,
        config.cp_size,
        config.sp_size,
    ) == (
        1,
        1,
        1,
        1,
        1,
    )
    assert config.cp_backend == "torch" and config.tp_handler is None and config.total_size == 1
    assert config.active_mesh_dims == [] and config.fsdp_dim_names == ["dp_shard_cp"]

    hybrid = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2, cp_size=2)
    assert hybrid.total_size == 16 and hybrid.data_parallel_size == 4 and hybrid.non_data_parallel_size == 4
    assert hybrid.dp_dim_names == ["dp_replicate", "dp_shard"]
    assert hybrid.non_dp_dim_names == ["tp", "cp"]
    assert hybrid.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    assert hybrid.dp_cp_dim_names == ["dp_replicate", "dp_shard", "cp"]
    assert hybrid.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert hybrid.active_mesh_dims == ["dp_replicate", "dp_shard", "tp", "cp"]
    # The mesh itself is laid out outermost first, tp innermost.
    assert hybrid.mesh_shape() == (("dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 2))
    # Handlers default where their dimension is on.
    assert isinstance(hybrid.tp_handler, TorchTensorParallelConfig)
    assert hybrid.cp_handler.cp_comm_strategy == "allgather"
    assert '"tp_size": 2' in hybrid.to_json() and "total_size=16" in repr(hybrid)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"tp_size": 0}, ["ParallelismConfig.tp_size", ">= 1"]),
        ({"dp_shard_size": "two"}, ["dp_shard_size", "'two'"]),
        ({"cp_backend": "ring"}, ["cp_backend='ring'", "torch"]),
        ({"cp_size": 2, "sp_size": 2}, ["cp_size=2", "sp_size=2", "mutually exclusive"]),
        ({"cp_size": 2, "cp_handler": object()}, ["cp_handler", "TorchContextParallelConfig"]),
        ({"tp_size": 2, "tp_handler": {"plan": 1}}, ["tp_handler", "TorchTensorParallelConfig"]),
    ],
)
def test_bad_values_name_the_field(fields, words):
    with pytest.raises(ConfigurationError) as raised:
        ParallelismConfig(**fields)
    assert all(word in str(raised.value) for word in words), str(raised.value)


def test_handlers_validate():
    with pytest.raises(ConfigurationError, match="cp_comm_strategy='ring'"):
        TorchContextParallelConfig(cp_comm_strategy="ring")
    with pytest.raises(ConfigurationError, match="tp_plan must be a dict"):
        TorchTensorParallelConfig(tp_plan=["colwise"])
    with pytest.warns(UserWarning, match="enable_async_tp"):
        TorchTensorParallelConfig(enable_async_tp=True)


def test_environment_fills_sizes_and_conflicts_name_both(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")  # Accelerate's launcher's spelling
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    config = ParallelismConfig(cp_size=2)
    assert (config.tp_size, config.dp_shard_size, config.cp_size) == (2, 4, 2)
    assert config.cp_handler.cp_comm_strategy == "alltoall"
    assert ParallelismConfig(tp_size=2).tp_size == 2  # agreeing is fine
    with pytest.raises(ConfigurationError) as raised:
        ParallelismConfig(tp_size=4)
    assert "ParallelismConfig(tp_size=4)" in str(raised.value)
    assert "DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE=2" in str(raised.value)
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "8")
    with pytest.raises(ConfigurationError, match="PARALLELISM_CONFIG_TP_SIZE=8"):
        ParallelismConfig()


def test_built_from_the_environment_only_when_asked(monkeypatch, tmp_path):
    assert ParallelismConfig.from_environment() is None
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    assert ParallelismConfig.from_environment().total_size == 1
    monkeypatch.delenv("ACCELERATE_USE_PARALLELISM_CONFIG")
    config_file = tmp_path / "config.yaml"
    config_file.write_text("parallelism_config:\n  parallelism_config_dp_shard_size: 2\n  tp_size: 2\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(config_file))
    config = ParallelismConfig.from_environment()
    assert (config.dp_shard_size, config.tp_size) == (2, 2)
    config_file.write_text("parallelism_config:\n  tensor_size: 2\n")
    with pytest.raises(ConfigurationError, match="unknown key.*tensor_size"):
        ParallelismConfig()


def test_sizes_not_matching_the_processes_are_one_error_naming_both():
    with pytest.raises(ConfigurationError) as raised:
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_shard_size=2))
    message = str(raised.value)
    assert "multiply to 2" in message and "1 processes" in message and "\n" not in message


def test_a_dimension_the_backend_does_not_declare_is_refused_naming_both():
    with pytest.raises(ConfigurationError) as raised:
        Accelerator(backend="ddp", cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
    message = str(raised.value)
    assert "tp_size=2" in message and "backend 'ddp'" in message and "dp_replicate" in message


def test_accelerator_accessors_and_a_second_accelerator():
    config = ParallelismConfig()
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    assert accelerator.parallelism_config is config and accelerator.state.parallelism_config is config
    assert accelerator.torch_device_mesh is None  # one process: no dimension is enabled
    assert (accelerator.tensor_parallel_rank, accelerator.data_parallel_rank) == (0, 0)
    assert (accelerator.data_parallel_shard_rank, accelerator.context_parallel_rank) == (0, 0)
    with pytest.raises(NotImplementedError):
        _ = accelerator.pipeline_parallel_rank
    # Same sizes: the new object (its handlers, a tensor-parallel plan) becomes the run's.
    again = ParallelismConfig(tp_handler=TorchTensorParallelConfig(tp_plan={"x": "colwise"}))
    with pytest.warns(UserWarning, match="tp_handler is set but tp_size is 1"):
        assert Accelerator(cpu=True, parallelism_config=again).parallelism_config is again


def test_a_second_accelerator_with_other_sizes_needs_reset_state():
    Accelerator(cpu=True, parallelism_config=ParallelismConfig())
    with pytest.raises(ConfigurationError, match="reset_state"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))


def test_ranks_need_a_config():
    with pytest.raises(RuntimeError, match="parallelism_config"):
        _ = Accelerator(cpu=True).tensor_parallel_rank


def test_torch_tp_plugin_is_accelerates_deprecated_spelling():
    with pytest.warns(FutureWarning, match="torch_tp_plugin"):
        accelerator = Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=1))
    assert accelerator.parallelism_config.tp_size == 1


def test_maybe_context_parallel_without_context_parallelism_warns_once_and_runs_the_block():
    accelerator = Accelerator(cpu=True)
    ran = []
    with pytest.warns(UserWarning, match="maybe_context_parallel has no effect"):
        with accelerator.maybe_context_parallel():
            ran.append(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with accelerator.maybe_context_parallel():
            ran.append(2)
    assert ran == [1, 2]


def test_launch_flags_export_the_settings():
    args = parse_arguments(
        [
            "--num_processes",
            "4",
            "--parallelism_config_tp_size",
            "2",
            "--parallelism_config_dp_shard_size",
            "2",
            "x.py",
        ]
    )
    env = environment_for(resolve_plan(args, environ={}))
    assert env["DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE"] == "2"
    assert env["DRIVETRAIN_PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
    assert env["DRIVETRAIN_USE_PARALLELISM_CONFIG"] == "1"


def test_launch_refuses_sizes_that_do_not_match_the_processes():
    args = parse_arguments(["--num_processes", "2", "--parallelism_config_tp_size", "4", "x.py"])
    with pytest.raises(UsageError) as raised:
        resolve_plan(args, environ={})
    assert "tp_size=4" in str(raised.value) and "--num_processes is 2" in str(raised.value)
    args = parse_arguments(["--num_processes", "2", "--parallelism_config_tp_size", "two", "x.py"])
    with pytest.raises(UsageError, match="tp_size"):
        resolve_plan(args, environ={})


def test_launch_reads_accelerates_config_section(tmp_path):
    config_file = tmp_path / "accelerate.yaml"
    config_file.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n"
        "parallelism_config:\n  parallelism_config_dp_replicate_size: 1\n  parallelism_config_tp_size: 2\n"
    )
    args = parse_arguments(["--config_file", str(config_file), "x.py"])
    env = environment_for(resolve_plan(args, environ={}))
    assert env["DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE"] == "2"
    # A flag overrides the file's value.
    args = parse_arguments(
        [
            "--config_file",
            str(config_file),
            "--parallelism_config_tp_size",
            "1",
            "--parallelism_config_dp_shard_size",
            "2",
            "x.py",
        ]
    )
    env = environment_for(resolve_plan(args, environ={}))
    assert env["DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE"] == "1"
