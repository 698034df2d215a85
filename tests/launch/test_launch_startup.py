"""What `drivetrain launch` imports before it starts the processes: plugin modules only when the command
line needs them (a plugin's option, --help, a named backend, the banner's automatic backend).

Each case runs the launcher's real `main()` in a fresh interpreter, with torch's elastic `run` replaced by a
recorder, and reports which modules were imported and what torch's launcher would have been given.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain.contract.info import ENTRY_POINT_GROUP

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, sys
import torch.distributed.run as torchrun

given = {}
torchrun.run = lambda args: given.update(
    nproc_per_node=args.nproc_per_node,
    command=[args.training_script, *args.training_script_args],
    no_python=args.no_python,
    log_dir=args.log_dir,
)
from drivetrain.commands.launch import main

code = main(sys.argv[1:])
print(json.dumps({
    "code": code,
    "given": given,
    "modules": sorted(sys.modules),
    "env": {k: v for k, v in os.environ.items() if k.startswith("DRIVETRAIN_") and k != "DRIVETRAIN_CONFIG_DIR"},
}))
"""


def probe(*args, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DRIVETRAIN_CONFIG_DIR": str(tmp_path / "no-config")}
    for name in [name for name in env if name.startswith("DRIVETRAIN_") and name != "DRIVETRAIN_CONFIG_DIR"]:
        del env[name]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def plugin_modules() -> dict[str, str]:
    """Plugin name -> the module its entry point names (what loading the plugin imports first)."""
    return {
        entry_point.name: entry_point.value.split(":")[0]
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    }


def test_a_plain_launch_imports_no_plugin_module(tmp_path):
    report, err = probe("--cpu", "--num_processes", "2", "--quiet", "noop.py", "--lr", "1", tmp_path=tmp_path)
    assert report["code"] == 0 and report["given"]["nproc_per_node"] == "2"
    # each process is the script run as torchrun runs it, through the guard that ends it with the launcher
    # (rank_guard.py), and torch's log folders go nowhere (none is left in the temporary folder)
    command, guard = report["given"]["command"], str(ROOT / "core" / "drivetrain" / "rank_guard.py")
    assert command[:4] == [sys.executable, "-I", "-S", guard] and command[4].isdigit()
    assert command[5:] == ["--", sys.executable, "-u", "noop.py", "--lr", "1"]
    assert report["given"]["no_python"] and report["given"]["log_dir"] == os.devnull
    assert report["env"] == {"DRIVETRAIN_CPU": "1"} and err == ""
    imported = set(report["modules"])
    assert sorted(module for module in plugin_modules().values() if module in imported) == []
    # nor the kernel's runtime: the processes import it, the launcher has no use for it
    assert "drivetrain.plugins" not in imported and "drivetrain.state" not in imported


def test_the_banner_names_the_automatic_backend_importing_plugins_only_up_to_it(tmp_path):
    report, err = probe("--cpu", "--num_processes", "2", "noop.py", tmp_path=tmp_path)
    assert report["code"] == 0
    assert "drivetrain launch: backend ddp (automatic), 2 processes on 1 machine (2 here, cpu)" in err
    imported = set(report["modules"])
    modules = plugin_modules()
    assert modules["ddp"] in imported
    # plugins named after the chosen one cannot come first (state.select_backend takes the first by name)
    later = sorted(name for name, module in modules.items() if name > "ddp" and module in imported)
    assert later == []


def test_one_process_imports_no_plugin_module(tmp_path):
    report, err = probe("--cpu", "-m", "package.train", "--epochs", "1", tmp_path=tmp_path)
    assert report["code"] == 0 and "backend local (automatic), 1 process on 1 machine" in err
    # a module runs as torchrun runs one (python -u -m), behind the rank guard
    assert report["given"]["command"][5:] == [
        "--",
        sys.executable,
        "-u",
        "-m",
        "package.train",
        "--epochs",
        "1",
    ]
    imported = set(report["modules"])
    assert sorted(module for module in plugin_modules().values() if module in imported) == []


def test_a_plugin_option_still_reaches_the_processes(tmp_path):
    pytest.importorskip("drivetrain_fsdp")
    report, _ = probe(
        "--cpu",
        "--num_processes",
        "2",
        "--quiet",
        "--backend",
        "fsdp",
        "--fsdp_sharding_strategy",
        "SHARD_GRAD_OP",
        "train.py",
        tmp_path=tmp_path,
    )
    assert report["code"] == 0 and report["env"]["DRIVETRAIN_BACKEND"] == "fsdp"
    assert json.loads(report["env"]["DRIVETRAIN_BACKEND_CONFIG"]) == {
        "fsdp_sharding_strategy": "SHARD_GRAD_OP"
    }
    assert json.loads(report["env"]["DRIVETRAIN_PLUGIN_OPTIONS"]) == {
        "fsdp": {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}
    }


def test_plugin_flags_in_help_and_errors(capsys):
    from drivetrain.commands.launch import main

    pytest.importorskip("drivetrain_fsdp")
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    assert "options of plugin fsdp:" in text and "--fsdp_sharding_strategy" in text
    assert "processes and precision:" in text
    # a misspelled plugin flag: one line, exit code 2, the flag it is close to
    assert main(["--fsdp_sharding_strateg", "FULL_SHARD", "x.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("drivetrain: error: ")
    assert "unrecognized arguments: --fsdp_sharding_strateg; did you mean --fsdp_sharding_strategy?" in err[0]
    assert main(["--num-procs", "2", "x.py"]) == 2
    assert "did you mean --num-processes?" in capsys.readouterr().err
    # a module and a program at once (torchrun refused it with a traceback)
    assert main(["-m", "--no_python", "pkg.train"]) == 2
    assert "-m runs a Python module and --no_python a program: use one of them" in capsys.readouterr().err
    # a bad value of a kernel option gives the kernel's error, as before
    assert main(["--num_processes", "two", "x.py"]) == 2
    assert "--num_processes expects a whole number, got 'two'" in capsys.readouterr().err


def test_a_backend_launcher_gets_every_plugin_option(tmp_path, monkeypatch):
    """A launcher registered by the named backend receives the arguments as one full parse gives them,
    though the command line was parsed with the kernel's options only."""
    from drivetrain import hookimpl
    from drivetrain.commands.launch import main
    from drivetrain.contract.info import PluginInfo
    from drivetrain.contract.registry import get_plugin_registry

    seen = []

    class FakeBackend:
        PLUGIN_INFO = PluginInfo(kind="backend")

        @staticmethod
        @hookimpl
        def register_extensions(registry):
            registry.add_launch_options(lambda group: group.add_argument("--fake_level", default="low"))
            registry.add_launcher(
                "fakebackend",
                lambda args, argv: seen.append((args.fake_level, args.num_processes, argv)) or 0,
            )

    monkeypatch.setenv("DRIVETRAIN_CONFIG_DIR", str(tmp_path / "no-config"))
    get_plugin_registry().register("fakebackend", FakeBackend())
    assert main(["--backend", "fakebackend", "--num_processes", "3", "run.py", "-x"]) == 0
    assert main(["--backend", "fakebackend", "--fake_level", "high", "run.py"]) == 0
    assert seen == [("low", 3, ["run.py", "-x"]), ("high", None, ["run.py"])]
