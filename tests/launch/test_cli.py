"""The `drivetrain` command line: plugins, env, config, estimate-memory, errors and help (real subprocesses
for each command; argument handling in-process where a subprocess adds nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from drivetrain.commands.launch import build_parser, first_host, resolve_plan, slurm_settings
from drivetrain.commands.main import main
from drivetrain.config.file import load_config
from drivetrain.errors import ConfigurationError


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cfg"
    monkeypatch.setenv("DRIVETRAIN_CONFIG_DIR", str(folder))
    return folder


def cli(*args, stdin=None, env=None, cwd=None):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "drivetrain.commands.main", *args],
        input=stdin,
        text=True,
        capture_output=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )


def test_plugins_lists_local_and_ddp_with_hooks_and_json(capsys):
    result = cli("plugins", "--json")
    assert result.returncode == 0, result.stderr
    records = {r["name"]: r for r in json.loads(result.stdout)}
    assert records["local"]["distribution"] == "drivetrain" and records["local"]["kind"] == "backend"
    assert "setup_process_group" in records["ddp"]["hooks"] and records["ddp"]["available"] is True
    assert main(["plugins", "--all", "--hook", "setup_process_group"]) == 0
    table = capsys.readouterr().out
    assert "capabilities:" in table and "ddp  (drivetrain-ddp" in table and "local  (drivetrain" in table
    assert main(["plugins", "--json", "--hook", "dispatch_module"]) == 0
    only_local = json.loads(capsys.readouterr().out)
    assert "local" in [r["name"] for r in only_local] and "ddp" not in [r["name"] for r in only_local]


def test_plugins_all_shows_every_capability(capsys):
    """docs/plugins/capabilities.md: `drivetrain plugins --all` shows every declared capability field."""
    import dataclasses

    from drivetrain.contract.info import Capabilities

    assert main(["plugins", "--all", "--hook", "setup_process_group"]) == 0
    table = capsys.readouterr().out
    ddp_line = next(
        line for line in table.splitlines() if "capabilities:" in line and "mesh_dimensions=" in line
    )
    for field in dataclasses.fields(Capabilities):
        assert f"{field.name}=" in ddp_line, ddp_line
    assert main(["plugins", "--all", "--json"]) == 0
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert records["ddp"]["capabilities"]["portable_checkpoints"] is True
    assert records["ddp"]["capabilities"]["local_gradients"] is True
    assert records["fsdp"]["capabilities"]["local_gradients"] is False
    assert records["deepspeed"]["capabilities"]["clipping_setting"] == "gradient_clipping"
    assert records["fsdp"]["capabilities"]["mesh_dimensions"] == ["dp_shard", "dp_replicate", "tp", "cp"]


def test_plugins_reports_missing_library(capsys):
    from drivetrain.contract.info import PluginInfo
    from drivetrain.contract.registry import get_plugin_registry

    class Broken:
        PLUGIN_INFO = PluginInfo(
            kind="feature",
            requires=("no_such_library_xyz",),
            optional_requires={"json": "reading JSON", "no_such_extra_xyz": "the extra backend"},
        )

    get_plugin_registry().register("needs-lib", Broken())
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "needs-lib" in out and "UNAVAILABLE: no_such_library_xyz is not installed" in out
    assert "json (reading JSON): installed" in out
    assert "no_such_extra_xyz (the extra backend): no_such_extra_xyz is not installed" in out


def test_listing_plugins_imports_no_backend_library():
    # Whether a plugin's library is installed is read from package metadata, not by importing it (DeepSpeed
    # takes seconds to import and prints on stdout).
    code = (
        "import sys; from drivetrain.commands.main import main; main(['plugins']); "
        "print('IMPORTED', sorted(m for m in sys.modules if m.split('.')[0] in "
        "('deepspeed', 'torch_xla', 'intel_extension_for_pytorch', 'megatron', 'torchao', 'transformer_engine',"
        " 'sympy')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # sympy: what torch.distributed.optim or torch._dynamo pull in (~600 modules, ~50 MB); a plugin module that
    # imports them at the top makes every listing, and every offloaded load, pay for it
    assert "IMPORTED []" in result.stdout
    assert "deepspeed" in result.stdout.split("IMPORTED")[0]  # listed all the same


def test_env_shows_config_in_effect(config_dir, capsys):
    config_dir.mkdir()
    (config_dir / "default_config.yaml").write_text("num_processes: 2\nmixed_precision: bf16\n")
    result = cli("env", env={"DRIVETRAIN_CONFIG_DIR": str(config_dir)})
    assert result.returncode == 0, result.stderr
    assert f"Config file: {config_dir / 'default_config.yaml'}" in result.stdout
    assert "mixed_precision: bf16" in result.stdout and "CPU count:" in result.stdout
    assert "ddp (drivetrain-ddp" in result.stdout
    # Each fp8 library is listed with whether it is installed (torchao is, TransformerEngine is not here).
    assert "torchao (" in result.stdout and "transformer_engine (" in result.stdout
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"] == {"num_processes": 2, "mixed_precision": "bf16"} and report["cpu_count"] >= 1


def test_user_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text("num_procesess: 2\n")
    cases = [
        (["launch", "--num_processes", "zero", "x.py"], "--num_processes expects a whole number"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (
            ["launch", "--mixed_precision", "fp12", "x.py"],
            "--mixed_precision must be one of no, fp8, fp16, bf16",
        ),
        (["launch", "--backend", "nope", "x.py"], "unknown drivetrain plugin 'nope'; installed: "),
        (["launch", "--config_file", str(bad_file), "x.py"], "did you mean 'num_processes'?"),
        (
            ["launch", "--num_processes", "3", "--num_machines", "2", "--main_process_ip", "h", "x.py"],
            "must be a multiple of --num_machines 2",
        ),
        (["launch", "--num_machines", "2", "x.py"], "needs --main_process_ip"),
        (["launch", "--env", "NOEQUALS", "x.py"], "--env expects KEY=VALUE"),
        (["launch", "--rdzv_backend", "static", "--max_restarts", "1", "x.py"], "needs --rdzv_backend c10d"),
        (["plugins", "--hook", "wrap_modle"], "unknown hook 'wrap_modle'"),
        (["estimate-memory", "no_such_module_xyz:Model"], "cannot import module 'no_such_module_xyz'"),
    ]
    for index, (argv, expected) in enumerate(cases):
        if index < 2:  # the real command, as a user runs it
            result = cli(*argv)
            code, err = result.returncode, result.stderr
        else:
            code, err = main(argv), capsys.readouterr().err
        assert code == 2, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("drivetrain: error: "), (argv, err)
        assert expected in lines[0], (argv, lines[0])


def test_help_groups_options_by_topic(capsys):
    result = cli("launch", "--help")
    assert result.returncode == 0
    for section in (
        "hardware and backend:",
        "processes and precision:",
        "multi-node",
        "fault tolerance and logs:",
    ):
        assert section in result.stdout
    # each option listed once, in its underscore spelling; the hyphen spelling only in the description's example
    assert "--num_processes N" in result.stdout and result.stdout.count("--num-processes") == 1
    assert "--num-processes N" not in result.stdout
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert all(name in top for name in ("launch", "config", "env", "plugins", "test", "estimate-memory"))


def test_plugin_commands_are_listed_with_their_plugin_and_run(capsys):
    from drivetrain import hookimpl
    from drivetrain.contract.registry import get_plugin_registry

    calls = []

    class MergePlugin:
        @staticmethod
        @hookimpl
        def register_extensions(registry):
            registry.add_command(
                "merge-things",
                lambda p: p.add_argument("--count", type=int, required=True),
                lambda args: calls.append(args.count) or 0,
                help="merge some things",
            )

    get_plugin_registry().register("merger", MergePlugin())
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "merge some things [plugin: merger]" in capsys.readouterr().out
    assert main(["merge-things", "--count", "3"]) == 0 and calls == [3]


def test_config_questionnaire_through_a_pipe(config_dir, capsys):
    # backend, machines, cpu only, processes, precision, dynamo, debug
    answers = "ddp\n1\nyes\n2\nbf16\n\nno\n"
    result = cli("config", stdin=answers, env={"DRIVETRAIN_CONFIG_DIR": str(config_dir)})
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load((config_dir / "default_config.yaml").read_text())
    assert written == {"backend": "ddp", "num_processes": 2, "mixed_precision": "bf16", "use_cpu": True}
    # an invalid answer is asked again; input that ends early is a one-line error
    import io

    from drivetrain.commands.config import Questions, questionnaire
    from drivetrain.commands.parsing import UsageError

    with pytest.raises(UsageError, match="no answer to 'How many processes"):
        questionnaire(Questions(io.StringIO("ddp\nmany\n1\nyes\n").readline))
    assert "invalid answer 'many'" in capsys.readouterr().out


def test_config_default_and_update_accelerate_file(config_dir, tmp_path, capsys):
    assert main(["config", "default", "--mixed_precision", "fp16"]) == 0
    values = yaml.safe_load((config_dir / "default_config.yaml").read_text())
    assert values["mixed_precision"] == "fp16" and values["num_processes"] >= 1
    assert main(["config", "default"]) == 2  # refuses to overwrite
    assert "--overwrite" in capsys.readouterr().err
    accelerate_file = tmp_path / "accelerate.yaml"
    accelerate_file.write_text(
        "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: FSDP\ndowncast_bf16: 'no'\n"
        "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\nmachine_rank: 0\nmain_training_function: main\n"
        "mixed_precision: 'no'\nnum_machines: 1\nnum_processes: 2\nrdzv_backend: static\nsame_network: true\n"
        "tpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n"
        "dynamo_config:\n  dynamo_backend: INDUCTOR\n"
    )
    from drivetrain.contract.registry import get_plugin_registry

    # The installed fsdp plugin declares distributed_type FSDP and its section fsdp_config.
    declarations = get_plugin_registry().config_declarations()
    loaded = load_config(accelerate_file, plugins=declarations)
    assert loaded.format == "accelerate"
    # Accelerate's always-written "no choice" values (mixed_precision: no, use_cpu: false) are dropped
    assert loaded.values == {
        "num_processes": 2,
        "num_machines": 1,
        "machine_rank": 0,
        "rdzv_backend": "static",
        "same_network": True,
        "backend": "fsdp",
        "dynamo_backend": "INDUCTOR",
        "backend_config": {"fsdp_sharding_strategy": "FULL_SHARD"},
    }
    assert main(["config", "update", "--config_file", str(accelerate_file)]) == 0
    assert load_config(accelerate_file).format == "drivetrain"
    assert load_config(accelerate_file, plugins=declarations).values == loaded.values
    # Without the plugin that answers it, Accelerate's distributed_type is an error naming what to install.
    megatron_file = tmp_path / "megatron.yaml"
    megatron_file.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MEGATRON_LM\n")
    declarations.distributed_types.pop("MEGATRON_LM", None)
    with pytest.raises(
        ConfigurationError,
        match="distributed_type MEGATRON_LM needs a plugin that is not "
        "installed: pip install drivetrain-megatron",
    ):
        load_config(megatron_file, plugins=declarations)


def test_launch_precedence_flag_over_file_over_default(tmp_path, config_dir):
    config_dir.mkdir()
    (config_dir / "default_config.yaml").write_text(
        "num_processes: 4\nmixed_precision: fp16\nuse_cpu: true\ngradient_accumulation_steps: 2\n"
        "env:\n  TEST_FROM_FILE: 'yes'\n"
    )
    args = build_parser().parse_args(
        ["--mixed-precision", "bf16", "--env", "TEST_X=1", "train.py", "--lr", "3"]
    )
    plan = resolve_plan(args, environ={})
    assert plan.chosen == {"mixed_precision": "bf16", "use_cpu": True, "gradient_accumulation_steps": 2}
    assert plan.num_processes == 4 and plan.env == {"TEST_FROM_FILE": "yes", "TEST_X": "1"}
    assert plan.script == "train.py" and plan.script_args == ["--lr", "3"]
    bare = resolve_plan(
        build_parser().parse_args(["--config_file", str(tmp_path / "empty.yaml"), "t.py"])
        if (tmp_path / "empty.yaml").write_text("{}\n")
        else None,
        environ={},
    )
    assert bare.rdzv_backend == "c10d" and bare.main_process_port > 0


def test_planning_a_launch_changes_nothing_in_this_process(tmp_path, config_dir):
    """The plan (launch_plan.py) is computed without side effects: resolving it, and the processes' environment
    and command line from it, leaves this process's environment as it was; only launch.py exports them."""
    from drivetrain.commands.launch_plan import environment_for, torchrun_arguments

    config = tmp_path / "launch.yaml"
    config.write_text("num_processes: 2\nmixed_precision: bf16\nenv:\n  TEST_FROM_FILE: 'yes'\n")
    before = dict(os.environ)
    plan = resolve_plan(
        build_parser().parse_args(["--config_file", str(config), "--debug", "--env", "TEST_X=1", "t.py"]),
        environ={},
    )
    exported = environment_for(plan)
    command = torchrun_arguments(plan)
    assert dict(os.environ) == before
    assert exported["DRIVETRAIN_MIXED_PRECISION"] == "bf16" and exported["DRIVETRAIN_DEBUG_MODE"] == "1"
    assert exported["TEST_FROM_FILE"] == "yes" and exported["TEST_X"] == "1"
    assert "--nproc_per_node=2" in command and command[-1] == "t.py"


def test_slurm_environment_fills_unset_multi_node_flags(config_dir):
    assert first_host("node[07-09,12],gpu1") == "node07" and first_host("gpu-a3") == "gpu-a3"
    environ = {
        "SLURM_STEP_ID": "0",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "trn[003-004]",
    }
    assert slurm_settings(environ) == {"num_machines": 2, "machine_rank": 1, "main_process_ip": "trn003"}
    assert slurm_settings({"SLURM_NNODES": "2"}) == {}  # the batch script itself, outside srun
    plan = resolve_plan(build_parser().parse_args(["--num_processes", "4", "t.py"]), environ=environ)
    assert (plan.num_machines, plan.machine_rank, plan.main_process_ip, plan.main_process_port) == (
        2,
        1,
        "trn003",
        29500,
    )
    assert plan.rdzv_backend == "static" and plan.nproc_per_node == 2
    flagged = resolve_plan(
        build_parser().parse_args(
            ["--num_processes", "4", "--machine_rank", "0", "--main_process_ip", "10.0.0.1", "t.py"]
        ),
        environ=environ,
    )
    assert (flagged.machine_rank, flagged.main_process_ip) == (0, "10.0.0.1")


def test_estimate_memory_module_class_and_local_config(tmp_path, capsys):
    result = cli("estimate-memory", "torch.nn:TransformerEncoderLayer", "--json")
    assert result.returncode == 2 and "cannot build it without arguments" in result.stderr
    assert main(["estimate-memory", "torch.nn:Transformer", "--dtypes", "float32", "float16", "--json"]) == 0
    rows = {r["dtype"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    import torch

    params = sum(p.numel() for p in torch.nn.Transformer().parameters())
    assert rows["float32"]["total_size"] == params * 4 and rows["float16"]["total_size"] == params * 2
    assert rows["float32"]["training_adam"] == params * 16
    assert set(rows) == {"float32", "float16"}


@pytest.mark.slow
def test_estimate_memory_transformers_config_folder(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = tmp_path / "tiny-bert"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "bert",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "intermediate_size": 64,
                "vocab_size": 100,
                "max_position_embeddings": 64,
            }
        )
    )
    assert main(["estimate-memory", str(folder / "config.json")]) == 0
    table = capsys.readouterr().out
    assert "| float32 |" in table and "| int4    |" in table and "Training using Adam" in table


def test_config_env_values_reach_the_processes_as_written_or_fail_naming_the_field(tmp_path):
    """Lists are joined with commas, never exported as their Python repr; a null is an error naming the
    field (issue 23, finding 8)."""
    from drivetrain.commands.launch import environment_for

    config = tmp_path / "c.yaml"
    config.write_text("num_processes: 1\nenv:\n  TEST_IDS: [0, 1]\n  TEST_FLAG: true\n  TEST_N: 3\n")
    plan = resolve_plan(build_parser().parse_args(["--config_file", str(config), "t.py"]), environ={})
    assert {k: v for k, v in environment_for(plan).items() if k.startswith("TEST_")} == {
        "TEST_IDS": "0,1",
        "TEST_FLAG": "1",
        "TEST_N": "3",
    }
    config.write_text("num_processes: 1\nenv:\n  TEST_B: null\n")
    with pytest.raises(
        ConfigurationError, match="config field env.TEST_B is null; an environment variable needs"
    ):
        resolve_plan(build_parser().parse_args(["--config_file", str(config), "t.py"]), environ={})
