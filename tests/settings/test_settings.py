"""Settings: the Accelerator's resolved settings, the one boolean vocabulary, the launcher's variables,
Accelerate's ``ACCELERATE_*`` variables and the config file named by ``DRIVETRAIN_CONFIG_FILE``.

See docs/configuration.md and the "Environment" section of docs/safety.md."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from drivetrain import Accelerator, GradientAccumulationPlugin, PartialState
from drivetrain.config import sources
from drivetrain.config.accelerator_settings import AcceleratorSettings, BackendConfigGroup
from drivetrain.config.file import load_config
from drivetrain.config.kwargs_handlers import GradScalerKwargs, InitProcessGroupKwargs
from drivetrain.config.parallelism import TorchTensorParallelPlugin
from drivetrain.contract.calling import tracing_enabled
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.contract.selection import select_backend
from drivetrain.errors import ConfigurationError, PluginError
from drivetrain.progress import progress_enabled

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_accelerate_variables(monkeypatch):
    """A developer's shell may hold Accelerate's variables; these tests set the ones they mean."""
    for name in list(os.environ):
        if name.startswith(("ACCELERATE_", "MEGATRON_LM_")) or name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name, raising=False)


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


# -- the Accelerator's settings, without a process ----------------------------------------------------------------
def test_settings_are_resolved_without_starting_anything(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS", "3")
    settings = AcceleratorSettings.resolve(
        split_batches=True, rng_types=["torch"], kwargs_handlers=[GradScalerKwargs()]
    )
    assert settings.gradient_accumulation_plugin.num_steps == 3
    assert settings.dataloader_config.split_batches is True and settings.rng_types == ("torch",)
    assert isinstance(settings.handler(GradScalerKwargs), GradScalerKwargs)
    assert settings.handler(InitProcessGroupKwargs) is None and settings.init_kwargs == {}
    assert PartialState._shared_state == {}  # no process state, no process group
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.backend = "ddp"  # type: ignore[misc]


def test_the_accelerator_reads_its_settings_object():
    plugin = GradientAccumulationPlugin(num_steps=2)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin, rng_types=["torch"])
    assert accelerator.settings.gradient_accumulation_plugin is plugin
    assert accelerator.gradient_accumulation_steps == 2 and accelerator.rng_types == ["torch"]
    assert accelerator.settings.dataloader_config is accelerator.dataloader_config


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"gradient_accumulation_steps": 2, "gradient_accumulation_plugin": GradientAccumulationPlugin()},
            "not both",
        ),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be >= 1, got 0"),
        ({"rng_types": ["dice"]}, "rng_types entry 'dice' is not valid; choose from"),
        ({"kwargs_handlers": [GradScalerKwargs(), GradScalerKwargs()]}, "holds two GradScalerKwargs"),
        ({"kwargs_handlers": [object()]}, "accepts KwargsHandler objects"),
        ({"dynamo_backend": "inductor", "dynamo_plugin": object()}, "either dynamo_backend or dynamo_plugin"),
        (
            {"backend_config": object(), "fsdp_plugin": object()},
            r"several backend configurations .*fsdp_plugin",
        ),
    ],
)
def test_arguments_that_contradict_each_other_are_refused_before_anything_starts(arguments, message):
    with pytest.raises(ConfigurationError, match=message):
        AcceleratorSettings.resolve(**arguments)
    assert PartialState._shared_state == {}


def test_a_dict_of_backend_configurations_is_a_group_of_one_backend():
    class Config:
        backend_name = "example"

    group = AcceleratorSettings.resolve(deepspeed_plugins={"a": Config(), "b": Config()}).backend_config
    assert (
        isinstance(group, BackendConfigGroup)
        and group.backend_name == "example"
        and list(group) == ["a", "b"]
    )

    class Other:
        backend_name = "other"

    with pytest.raises(ConfigurationError, match="configurations of one backend"):
        AcceleratorSettings.resolve(deepspeed_plugins={"a": Config(), "b": Other()})


def test_torch_tp_plugin_becomes_a_parallelism_config_with_a_warning_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        settings = AcceleratorSettings.resolve(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2))
    assert settings.parallelism_config.tp_size == 2
    (warning,) = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert "torch_tp_plugin" in str(warning.message)


# -- one boolean vocabulary ---------------------------------------------------------------------------------------
def test_every_boolean_word_of_accelerate_is_accepted_and_nothing_else():
    for word in ("y", "yes", "t", "true", "on", "1", "Y", "YES", "True", "ON"):
        assert sources.to_bool(word) is True
    for word in ("n", "no", "f", "false", "off", "0", "N", "No", "FALSE", "Off"):
        assert sources.to_bool(word) is False
    assert sources.to_bool(True) is True and sources.to_bool(0) is False
    for value in ("maybe", "", "2", "yess", 2, 0.5):
        with pytest.raises(ConfigurationError, match="is not a boolean; use one of y, yes, t, true, on, 1"):
            sources.to_bool(value, "SOME_SETTING")
    with pytest.raises(ConfigurationError) as caught:
        sources.to_bool("maybe", "SOME_SETTING")
    assert _one_line(caught.value).startswith("SOME_SETTING='maybe' is not a boolean")


@pytest.mark.parametrize(
    ("variable", "read"),
    [
        ("DRIVETRAIN_CPU", lambda: Accelerator()),
        ("ACCELERATE_USE_CPU", lambda: Accelerator()),
        ("DRIVETRAIN_DEBUG_MODE", lambda: Accelerator()),
        ("ACCELERATE_DEBUG_MODE", lambda: Accelerator()),
        ("DRIVETRAIN_CPU_AFFINITY", lambda: Accelerator()),
        ("ACCELERATE_USE_FSDP", lambda: Accelerator()),
        ("DRIVETRAIN_TRACE_PLUGINS", tracing_enabled),
        ("DRIVETRAIN_DISABLE_PROGRESS_BARS", progress_enabled),
        ("ACCELERATE_DYNAMO_USE_FULLGRAPH", lambda: Accelerator()),
    ],
)
def test_a_bad_boolean_variable_names_the_variable(monkeypatch, variable, read):
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ConfigurationError) as caught:
        read()
    assert variable in _one_line(caught.value) and "is not a boolean" in str(caught.value)


def test_a_bad_boolean_in_the_config_file_names_the_file_and_key(monkeypatch, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("use_cpu: maybe\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(path))
    with pytest.raises(ConfigurationError) as caught:
        Accelerator()
    assert f"config file {path}: use_cpu: 'maybe' is not valid (expected a boolean" in _one_line(caught.value)


# -- the launcher's variables ---------------------------------------------------------------------------------------
BAD_VARIABLES = [
    ({"LOCAL_RANK": "abc"}, "LOCAL_RANK='abc' is not valid: expected a whole number >= 0"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not valid: expected a whole number >= 1"),
    ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1' is not valid: expected a whole number >= 1"),
    ({"LOCAL_RANK": "-5"}, "LOCAL_RANK='-5' is not valid: expected a whole number >= 0"),
    ({"RANK": "abc"}, "RANK='abc' is not valid: expected a whole number >= 0"),
    ({"RANK": "1"}, "RANK=1 is not valid: expected a whole number below the number of processes, 1"),
]


@pytest.mark.parametrize(("variables", "message"), BAD_VARIABLES, ids=lambda v: str(v))
def test_a_bad_launcher_variable_stops_the_state_before_anything_is_set_up(monkeypatch, variables, message):
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigurationError) as caught:
        Accelerator()
    assert _one_line(caught.value).startswith("environment variable ") and message in str(caught.value)
    assert PartialState._shared_state == {}  # no device chosen, no group joined


@pytest.mark.parametrize(
    ("variables", "message"), [BAD_VARIABLES[0], BAD_VARIABLES[2]], ids=["not-a-number", "out-of-range"]
)
def test_a_bad_launcher_variable_is_one_line_naming_it(tmp_path, variables, message):
    """A real process started with the variable, as a launcher would start it: it stops before choosing a device
    or joining a group, and the last line of its error output says why (the other values: the test above)."""
    script = tmp_path / "train.py"
    script.write_text("from drivetrain import Accelerator\nAccelerator()\nprint('started')\n")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE") and not key.startswith("DRIVETRAIN_")
    }
    env.update(variables, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert result.returncode != 0 and "started" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("drivetrain.errors.ConfigurationError: environment variable ") and message in last
    assert "invalid literal" not in result.stderr


def test_launcher_variables_are_checked_against_each_other(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigurationError, match=r"RANK=2 is not valid: .* processes, 2 \(from WORLD_SIZE\)"):
        PartialState()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ConfigurationError, match="LOCAL_RANK=2 is not valid: .* below LOCAL_WORLD_SIZE=2"):
        PartialState()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(ConfigurationError, match="LOCAL_WORLD_SIZE='0' is not valid"):
        PartialState()


def test_logging_before_the_state_names_a_bad_rank(monkeypatch):
    from drivetrain.logging import get_logger

    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigurationError, match="RANK='x' is not valid"):
        get_logger("settings-test").warning("hello")


# -- Accelerate's variables ---------------------------------------------------------------------------------------
def test_accelerate_variables_set_the_same_settings(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "EAGER")
    accelerator = Accelerator()
    assert accelerator.mixed_precision == "bf16" and accelerator.gradient_accumulation_steps == 4
    assert accelerator.state.cpu is True and accelerator.state.debug is True
    assert accelerator.state.dynamo_plugin.backend.value == "EAGER"


def test_values_accelerates_launcher_always_writes_state_no_choice(monkeypatch):
    # `accelerate launch` exports these whatever was chosen; there the script's argument wins.
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "False")
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    accelerator = Accelerator(mixed_precision="bf16", cpu=True, dynamo_backend="eager")
    assert accelerator.mixed_precision == "bf16" and accelerator.backend == "local"
    assert accelerator.state.dynamo_plugin.backend.value == "EAGER"


@pytest.mark.parametrize(
    ("variables", "arguments", "named"),
    [
        (
            {"ACCELERATE_MIXED_PRECISION": "fp16"},
            {"mixed_precision": "bf16"},
            ["Accelerator(mixed_precision='bf16')", "ACCELERATE_MIXED_PRECISION=fp16"],
        ),
        (
            {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"},
            {"gradient_accumulation_steps": 2},
            ["Accelerator(gradient_accumulation_steps=2)", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4"],
        ),
    ],
)
def test_an_accelerate_variable_contradicting_the_script_raises_naming_both(
    monkeypatch, variables, arguments, named
):
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigurationError) as caught:
        Accelerator(**arguments)
    assert all(name in _one_line(caught.value) for name in named)


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        (
            {"DRIVETRAIN_MIXED_PRECISION": "fp16", "ACCELERATE_MIXED_PRECISION": "bf16"},
            ["DRIVETRAIN_MIXED_PRECISION=fp16", "ACCELERATE_MIXED_PRECISION=bf16"],
        ),
        (
            {"DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS": "2", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3"},
            ["DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS=2", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=3"],
        ),
        (
            {"DRIVETRAIN_DYNAMO_BACKEND": "inductor", "ACCELERATE_DYNAMO_BACKEND": "EAGER"},
            ["DRIVETRAIN_DYNAMO_BACKEND=inductor", "ACCELERATE_DYNAMO_BACKEND=EAGER"],
        ),
        (
            {
                "DRIVETRAIN_DEBUG_MODE": "1",
                "ACCELERATE_DEBUG_MODE": "true",
                "DRIVETRAIN_CPU_AFFINITY": "0",
                "ACCELERATE_CPU_AFFINITY": "1",
            },
            ["DRIVETRAIN_CPU_AFFINITY=0", "ACCELERATE_CPU_AFFINITY=1"],
        ),
        (
            {"DRIVETRAIN_BACKEND": "local", "ACCELERATE_USE_FSDP": "true"},
            ["DRIVETRAIN_BACKEND=local", "ACCELERATE_USE_FSDP=true"],
        ),
    ],
)
def test_a_drivetrain_and_an_accelerate_variable_that_disagree_raise_naming_both(
    monkeypatch, variables, named
):
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigurationError) as caught:
        Accelerator()
    assert all(name in _one_line(caught.value) for name in named), caught.value


def test_a_drivetrain_and_an_accelerate_variable_that_agree_are_fine(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "BF16")
    monkeypatch.setenv("DRIVETRAIN_DYNAMO_BACKEND", "eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "EAGER")
    assert Accelerator().mixed_precision == "bf16"


def test_accelerates_backend_switches_select_the_backend_that_declares_the_flag(monkeypatch):
    manager = get_plugin_registry()
    if manager.backend_for_flag("use_fsdp") is None:
        pytest.skip("drivetrain-fsdp is not installed")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "1")
    chosen = select_backend(manager, None, None)
    assert (chosen.value, chosen.source) == ("fsdp", "environment ACCELERATE_USE_FSDP=1")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigurationError) as caught:
        select_backend(manager, None, None)
    assert "ACCELERATE_USE_FSDP=1" in str(caught.value) and "ACCELERATE_USE_DEEPSPEED=true" in str(
        caught.value
    )


def test_a_backend_switch_for_a_plugin_that_is_not_installed_names_the_distribution(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_LOAD_PLUGINS", "local")
    monkeypatch.setenv("ACCELERATE_USE_MEGATRON_LM", "true")
    from drivetrain.contract.registry import reset_plugin_registry

    reset_plugin_registry()
    with pytest.raises(
        PluginError, match="ACCELERATE_USE_MEGATRON_LM=true selects .* pip install drivetrain-megatron"
    ):
        select_backend(get_plugin_registry(), None, None)


def _launch(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {
        **{
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DRIVETRAIN_", "ACCELERATE_"))
        },
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "DRIVETRAIN_CONFIG_DIR": str(tmp_path / "no-config"),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "drivetrain.launch", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


@pytest.mark.multiprocess
def test_accelerate_variables_are_read_in_launched_processes(tmp_path):
    """Two processes started by `drivetrain launch`, whose config file hands them Accelerate's variables (as a
    launcher written for Accelerate would): each process runs with those settings."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            from drivetrain import Accelerator

            accelerator = Accelerator()
            print(
                f"rank={accelerator.process_index} precision={accelerator.mixed_precision} "
                f"steps={accelerator.gradient_accumulation_steps} backend={accelerator.backend}",
                flush=True,
            )
            accelerator.end_training()
            """
        )
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        "num_processes: 2\nuse_cpu: true\nenv:\n  ACCELERATE_MIXED_PRECISION: bf16\n"
        "  ACCELERATE_GRADIENT_ACCUMULATION_STEPS: 4\n"
    )
    result = _launch(tmp_path, "--config_file", str(config), "--quiet", str(script))
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert f"rank={rank} precision=bf16 steps=4 backend=ddp" in result.stdout


# -- the config file named by DRIVETRAIN_CONFIG_FILE ---------------------------------------------------------------
def test_an_unknown_config_key_is_the_same_error_through_launch_and_the_environment(monkeypatch, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("mixed_precison: bf16\n")
    with pytest.raises(ConfigurationError) as through_launch:
        load_config(path, plugins=get_plugin_registry().config_declarations)
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(path))
    with pytest.raises(ConfigurationError) as through_environment:
        Accelerator()
    assert str(through_environment.value) == str(through_launch.value)
    assert f"config file {path}: unknown key 'mixed_precison'; did you mean 'mixed_precision'?" in _one_line(
        through_environment.value
    )
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    launched = _launch(tmp_path, "--config_file", str(path), str(script))
    assert launched.returncode != 0 and "ran" not in launched.stdout
    assert str(through_launch.value) in launched.stderr.strip().splitlines()[-1]


def test_the_config_file_takes_launch_spellings_and_accelerate_files(monkeypatch, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("use_cpu: yes\ngradient_accumulation_steps: 3\nnum_processes: 1\ndebug: on\n")
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(path))
    accelerator = Accelerator()
    assert accelerator.state.cpu is True and accelerator.gradient_accumulation_steps == 3
    assert accelerator.state.debug is True
    from drivetrain import reset_state

    reset_state()
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: bf16\nuse_cpu: false\n"
        "num_processes: 1\n"
    )
    assert Accelerator().mixed_precision == "bf16"
